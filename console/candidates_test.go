package console_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/jobs"
)

// routedAttempt runs one attempt of a new "summarize" job of tenant in the
// default queue, ended on candidate with outcome o after moves.
func (f *fixture) routedAttempt(t *testing.T, tenant string, o jobs.CompletionOutcome, candidate, model string, usage jobs.Usage, moves ...jobs.Move) *jobs.Job {
	t.Helper()
	ctx := t.Context()
	_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "summarize", Queue: "default"})
	require.NoError(t, err)
	var j *jobs.Job
	// A claim may come up empty on a tenant with nothing of the kind
	// runnable, marking it idle; the next one reaches this job.
	for range 5 {
		claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "default", Kinds: []string{"summarize"},
			Worker: "worker-r", Limit: 1, LeaseDuration: time.Minute})
		require.NoError(t, err)
		if len(claimed) == 1 {
			j = claimed[0]
			break
		}
	}
	require.NotNil(t, j, "the job of %s is claimed", tenant)
	c := completion(j, o, "transient", usage)
	c.Candidate, c.Model, c.Moves = candidate, model, moves
	res, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	return j
}

// candidateRow finds a candidate's row in the admission page's route
// candidates section and returns its cells' text.
func candidateRow(t *testing.T, body, candidate string) []string {
	t.Helper()
	start := strings.Index(body, `<section id="candidates">`)
	require.NotEqual(t, -1, start, "the page has the route candidates section")
	section, _, found := strings.Cut(body[start:], "</section>")
	require.True(t, found, "the section ends")
	row := regexp.MustCompile(`<tr><td>` + regexp.QuoteMeta(candidate) + `</td>(.*?)</tr>`).FindStringSubmatch(section)
	if row == nil {
		return nil
	}
	cells := regexp.MustCompile(`<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(row[1], -1)
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = c[1]
	}
	return out
}

// The admission page shows, per route candidate and model, the attempts
// of the last hour that ended on it by outcome, its moves by failure and
// the tokens; a tenant's console counts only its tenant's attempts and
// names no candidate only another tenant used. Every value is escaped.
func TestAdmissionShowsRouteCandidates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, body := get(t, f.console(t, console.Config{}), "/pools")
	require.Contains(t, body, "Route candidates (last hour)")
	require.Contains(t, body, "No attempt of a kind with a route started in the last hour.", "the fixture has no route")

	rateLimited := jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "rate_limited", InputTokens: 10}
	f.routedAttempt(t, "acme", jobs.OutcomeSucceeded, "openai-us", "gpt-large", jobs.Usage{InputTokens: 1200, OutputTokens: 300}, rateLimited)
	f.routedAttempt(t, "acme", jobs.OutcomeRetry, "openai-us", "gpt-large", jobs.Usage{InputTokens: 800},
		jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "timeout"})
	f.routedAttempt(t, "globex", jobs.OutcomeSucceeded, "openai-us", "gpt-large", jobs.Usage{InputTokens: 5000, OutputTokens: 1000}, rateLimited)
	f.routedAttempt(t, "globex", jobs.OutcomeSnoozed, "mistral-fr", "mistral-large", jobs.Usage{})
	f.routedAttempt(t, "globex", jobs.OutcomeSucceeded, `eu<b>1</b>`, `m"&'`, jobs.Usage{InputTokens: 1})

	code, body := get(t, f.console(t, console.Config{}), "/pools")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "No attempt of a kind with a route")
	require.Equal(t, []string{"gpt-large", "3", "2", "1", "0", "0", "7,000", "1,300"}, candidateRow(t, body, "openai-us"), "every tenant's")
	require.Equal(t, []string{"claude-sonnet", "0", "0", "0", "0",
		`3 <span class="tag">rate_limited 2</span> <span class="tag">timeout 1</span>`, "0", "0"}, candidateRow(t, body, "anthropic-eu"))
	require.Equal(t, []string{"mistral-large", "1", "0", "0", "1", "0", "0", "0"}, candidateRow(t, body, "mistral-fr"))
	require.Equal(t, []string{"m&#34;&amp;&#39;", "1", "1", "0", "0", "0", "1", "0"}, candidateRow(t, body, "eu&lt;b&gt;1&lt;/b&gt;"), "escaped")
	require.NotContains(t, body, "<b>1</b>")

	// The pools' refreshes do not carry the section.
	code, body = get(t, f.console(t, console.Config{}), "/pools?fragment=pools")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "Route candidates")

	code, body = get(t, f.console(t, console.Config{Tenant: "acme"}), "/pools")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, []string{"gpt-large", "2", "1", "1", "0", "0", "2,000", "300"}, candidateRow(t, body, "openai-us"), "acme's attempts only")
	require.Equal(t, []string{"claude-sonnet", "0", "0", "0", "0",
		`2 <span class="tag">rate_limited 1</span> <span class="tag">timeout 1</span>`, "0", "0"}, candidateRow(t, body, "anthropic-eu"), "acme's moves only")
	require.NotContains(t, body, "mistral", "a candidate only globex used")
	require.NotContains(t, body, "eu&lt;b&gt;1")
	require.NotContains(t, body, "globex")

	code, body = get(t, f.console(t, console.Config{Tenant: "globex"}), "/pools")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, []string{"gpt-large", "1", "1", "0", "0", "0", "5,000", "1,000"}, candidateRow(t, body, "openai-us"), "globex's attempts only")
	require.NotNil(t, candidateRow(t, body, "mistral-fr"))

	code, body = get(t, f.console(t, console.Config{Tenant: "initech"}), "/pools")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "No attempt of a kind with a route started in the last hour.", "a tenant without routed attempts")
}

// The job page names the candidate that served each attempt, with its
// model, and the calls that moved on before it, each value isolated.
func TestJobPageShowsRoute(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	j := f.routedAttempt(t, "acme", jobs.OutcomeSucceeded, "anthropic-eu", "claude-sonnet", jobs.Usage{InputTokens: 900, OutputTokens: 60},
		jobs.Move{Candidate: "openai-us", Model: "gpt-<large>", Failure: "rate_limited", Error: "429 Too Many Requests", InputTokens: 5, Uncertain: true})
	h := f.console(t, console.Config{})
	code, body := get(t, h, "/jobs/"+j.ID.String())
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<td class="served"><bdi>anthropic-eu</bdi> <span class="muted">(<bdi>claude-sonnet</bdi>)</span>`)
	require.Contains(t, body, `<div class="muted move">after <bdi>openai-us</bdi> (<bdi>gpt-&lt;large&gt;</bdi>): rate_limited, 5 / 0 tokens, uncertain: 429 Too Many Requests</div>`)
}
