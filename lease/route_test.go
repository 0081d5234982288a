package lease_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/google/uuid"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/internal/telemetry/telemetrytest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	llmqopenai "github.com/llmq/llmq/provider/openai"
)

// invoice is a document the fake model reads.
const invoice = fakeprovider.SampleInvoice

// routeFixture is a runner whose kind "extract" routes to a primary
// candidate (OpenAI's dialect) and a secondary (Anthropic's), each a fake
// provider behind its own HTTP server and its own admission pool.
type routeFixture struct {
	*fixture
	limiter            *admission.Local
	primary, secondary *fakeprovider.Server
	// hits counts the HTTP requests that reached each server.
	primaryHits, secondaryHits atomic.Int64
	primaryURL, secondaryURL   string
}

func newRouteFixture(t *testing.T) *routeFixture {
	t.Helper()
	f := &routeFixture{fixture: setup(t)}
	f.primary = fakeprovider.New(fakeprovider.Config{Scale: 15_000})
	f.secondary = fakeprovider.New(fakeprovider.Config{Scale: 15_000})
	f.primaryURL = serveCounted(t, f.primary, &f.primaryHits)
	f.secondaryURL = serveCounted(t, f.secondary, &f.secondaryHits)
	var err error
	f.limiter, err = admission.NewLocal(
		admission.Pool{Name: "primary", RPM: 60_000, TPM: 60_000_000, MaxInFlight: 10},
		admission.Pool{Name: "secondary", RPM: 60_000, TPM: 60_000_000, MaxInFlight: 10})
	require.NoError(t, err)
	return f
}

func serveCounted(t *testing.T, h http.Handler, hits *atomic.Int64) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// candidates are the route's two candidates, the primary's client on
// primaryURL (a test may point it elsewhere).
func (f *routeFixture) candidates(t *testing.T, primaryURL string) []lease.Candidate {
	t.Helper()
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	httpClient := &http.Client{Transport: transport}
	openai, err := llmqopenai.NewClient(llmqopenai.Config{}, option.WithBaseURL(primaryURL), option.WithAPIKey("k"),
		option.WithHTTPClient(httpClient), option.WithRequestTimeout(time.Second))
	require.NoError(t, err)
	anthropic, err := llmqanthropic.NewClient(llmqanthropic.Config{}, aopt.WithBaseURL(strings.TrimSuffix(f.secondaryURL, "/v1")), aopt.WithAPIKey("k"),
		aopt.WithHTTPClient(httpClient), aopt.WithRequestTimeout(time.Second))
	require.NoError(t, err)
	return []lease.Candidate{
		{Name: "primary", Pool: "primary", Model: "gpt-fake", Adapter: openai},
		{Name: "secondary", Pool: "secondary", Model: "claude-fake", Adapter: anthropic},
	}
}

// extract is one handler for every candidate: it asks the candidate's
// model through the candidate's client, and refuses output that is not
// JSON.
func extract() lease.HandlerFunc {
	return func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		cand, ok := lease.CandidateOf(ctx)
		if !ok {
			return nil, errors.New("no route candidate on the attempt's context")
		}
		var text string
		if err := json.Unmarshal(job.Payload, &text); err != nil {
			return nil, jobs.Permanent(err)
		}
		var content string
		switch client := cand.Adapter.(type) {
		case *llmqopenai.Client:
			params := oai.ChatCompletionNewParams{Model: cand.Model}
			if text != "" { // without messages the provider answers 400
				params.Messages = []oai.ChatCompletionMessageParamUnion{oai.UserMessage(text)}
			}
			answer, err := llmqopenai.Call(ctx, func(ctx context.Context) (*oai.ChatCompletion, error) {
				return client.Chat.Completions.New(ctx, params)
			})
			if err != nil {
				return nil, err
			}
			content = answer.Choices[0].Message.Content
		case *llmqanthropic.Client:
			answer, err := llmqanthropic.Call(ctx, func(ctx context.Context) (*sdk.Message, error) {
				return client.Messages.New(ctx, sdk.MessageNewParams{Model: cand.Model, MaxTokens: 512,
					Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(text))}})
			})
			if err != nil {
				return nil, err
			}
			content = answer.Content[0].Text
		default:
			return nil, jobs.Permanent(errors.New("unknown adapter " + cand.Adapter.Provider()))
		}
		if !json.Valid([]byte(content)) {
			return nil, jobs.InvalidOutput(errors.New("the answer is not JSON"), nil)
		}
		return json.RawMessage(content), nil
	}
}

// start runs a runner routing "extract" by route, whose handler is
// extract.
func (f *routeFixture) start(route lease.Route) {
	f.t.Helper()
	cfg := fastConfig(map[string]lease.Handler{"extract": extract()})
	cfg.Admission = &lease.Admission{Limiter: f.limiter, Routes: map[string]lease.Route{"extract": route}}
	f.fixture.start(cfg)
}

func (f *routeFixture) enqueueDocument(text string) *jobs.Job {
	f.t.Helper()
	payload, err := json.Marshal(text)
	require.NoError(f.t, err)
	return f.enqueue(jobs.EnqueueParams{Kind: "extract", Payload: payload, EstimatedTokens: 500})
}

// firstAttempt waits until the job's first attempt has ended.
func (f *routeFixture) firstAttempt(id uuid.UUID) jobs.Attempt {
	f.t.Helper()
	var first jobs.Attempt
	require.Eventually(f.t, func() bool {
		attempts, err := f.store.Attempts(f.t.Context(), f.pool, "acme", id)
		require.NoError(f.t, err)
		if len(attempts) == 0 || attempts[0].EndedAt.IsZero() {
			return false
		}
		first = attempts[0]
		return true
	}, 15*time.Second, 10*time.Millisecond)
	return first
}

// A failure of the provider's moves the attempt to the next candidate at
// once, in the same attempt: the attempt names the candidate that served
// and records the call that moved on, and each server saw exactly the
// calls the attempt records.
func TestRouteMovesOnForTheProvidersFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		primary   func(f *routeFixture) string // the primary's base URL, after any fault is set
		failure   string
		uncertain bool
		hits      int64 // requests that reached the primary's fake provider
	}{
		{name: "429", failure: "rate_limited", uncertain: true, hits: 1, primary: func(f *routeFixture) string {
			f.primary.Storm(time.Minute)
			return f.primaryURL
		}},
		{name: "500", failure: "server_error", uncertain: true, hits: 1, primary: func(f *routeFixture) string {
			f.primary.FailNext(1)
			return f.primaryURL
		}},
		{name: "refused connection", failure: "unreachable", primary: func(f *routeFixture) string {
			return closedURL(f.t)
		}},
		{name: "connection lost after sending", failure: "timeout", uncertain: true, primary: func(f *routeFixture) string {
			return droppingURL(f.t)
		}},
		{name: "context window", failure: "context_window", primary: func(f *routeFixture) string {
			return contextWindowURL(f.t)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newRouteFixture(t)
			route := lease.Route{Candidates: f.candidates(t, tc.primary(f))}
			f.start(route)
			job := f.enqueueDocument(invoice)

			done := f.await(job.ID)
			require.Equal(t, jobs.StateSucceeded, done.State, done.LastError)
			attempts := f.attempts(job.ID)
			require.Len(t, attempts, 1, "the move stays inside the attempt")
			a := attempts[0]
			require.Equal(t, "secondary", a.Candidate)
			require.Equal(t, "claude-fake", a.Model)
			require.Len(t, a.Moves, 1)
			require.Equal(t, "primary", a.Moves[0].Candidate)
			require.Equal(t, "gpt-fake", a.Moves[0].Model)
			require.Equal(t, tc.failure, a.Moves[0].Failure)
			require.Equal(t, tc.uncertain, a.Moves[0].Uncertain, "a call that may have been billed is marked so")
			require.NotEmpty(t, a.Moves[0].Error)
			require.Equal(t, tc.hits, f.primaryHits.Load())
			require.EqualValues(t, 1, f.secondaryHits.Load())
			require.Positive(t, a.Usage.InputTokens, "the serving call's usage is the attempt's")
		})
	}
}

// A failure of the request's or the answer's never moves the attempt:
// another model would be paid to be asked the same thing.
func TestRouteDoesNotMoveOnForTheRequestsFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		class      string
	}{
		{name: "invalid output", text: invoice + "[[fake:malformed]]\n", class: jobs.ClassInvalidOutput},
		{name: "a 400 for the request", text: "", class: jobs.ClassPermanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newRouteFixture(t)
			f.start(lease.Route{Candidates: f.candidates(t, f.primaryURL)})
			job := f.enqueueDocument(tc.text)
			a := f.firstAttempt(job.ID)
			require.Equal(t, tc.class, a.ErrorClass, a.Error)
			require.Equal(t, "primary", a.Candidate)
			require.Empty(t, a.Moves)
			require.Zero(t, f.secondaryHits.Load())
		})
	}
}

// A pool that cannot grant within the wait (cooling down) is passed over
// without a call; once it grants again the attempts go back to it.
func TestRoutePassesOverACoolingPoolAndReturns(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	const cooldown = 2 * time.Second
	require.NoError(t, f.limiter.Cooldown(t.Context(), "primary", cooldown))
	f.start(lease.Route{Candidates: f.candidates(t, f.primaryURL)})

	job := f.enqueueDocument(invoice)
	require.Equal(t, jobs.StateSucceeded, f.await(job.ID).State)
	a := f.attempts(job.ID)[0]
	require.Equal(t, "secondary", a.Candidate)
	require.Empty(t, a.Moves, "passing over a pool makes no call")
	require.Zero(t, f.primaryHits.Load())

	require.Eventually(t, func() bool { return f.limiter.Ready(t.Context(), "primary", 0) == nil }, 2*cooldown, 10*time.Millisecond)
	job = f.enqueueDocument(invoice)
	require.Equal(t, jobs.StateSucceeded, f.await(job.ID).State)
	require.Equal(t, "primary", f.attempts(job.ID)[0].Candidate)
}

// With every candidate's pool cooling down, the job is snoozed for the
// soonest of their waits, without a call and without counting the attempt.
func TestRouteWithNoCandidateReadySnoozesForTheSoonest(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	require.NoError(t, f.limiter.Cooldown(t.Context(), "primary", time.Hour))
	require.NoError(t, f.limiter.Cooldown(t.Context(), "secondary", 30*time.Second))
	f.start(lease.Route{Candidates: f.candidates(t, f.primaryURL)})

	job := f.enqueueDocument(invoice)
	a := f.firstAttempt(job.ID)
	require.Equal(t, jobs.AttemptSnoozed, a.Outcome)
	require.WithinDuration(t, a.EndedAt.Add(30*time.Second), a.RetryAt, 2*time.Second)
	require.Zero(t, f.primaryHits.Load()+f.secondaryHits.Load())
}

// A pinned route uses its one candidate: never the others, even when the
// pinned one fails in a way the route would otherwise move on for.
func TestPinnedRouteNeverFallsBack(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	f.primary.Storm(time.Minute)
	f.start(lease.Route{Candidates: f.candidates(t, f.primaryURL), Pin: "primary"})

	job := f.enqueueDocument(invoice)
	a := f.firstAttempt(job.ID)
	require.Equal(t, jobs.AttemptSnoozed, a.Outcome, "the pinned candidate's 429 snoozes the job")
	require.Equal(t, "primary", a.Candidate)
	require.Zero(t, f.secondaryHits.Load())
}

// MoveOn narrows what moves an attempt: a route that moves on for rate
// limits only lets a 500 end the attempt on the primary.
func TestRouteMovesOnOnlyForWhatItNames(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	f.primary.FailNext(1)
	f.start(lease.Route{Candidates: f.candidates(t, f.primaryURL), MoveOn: []lease.Failure{lease.FailureRateLimited}})
	job := f.enqueueDocument(invoice)
	a := f.firstAttempt(job.ID)
	require.Equal(t, jobs.AttemptRetryScheduled, a.Outcome, a.Error)
	require.Equal(t, jobs.ClassTransient, a.ErrorClass)
	require.Equal(t, "primary", a.Candidate)
	require.Zero(t, f.secondaryHits.Load())
}

// closedURL is a base URL nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/v1"
	srv.Close()
	return url
}

// droppingURL's server reads each request and closes the connection
// without answering.
func droppingURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = conn.Close()
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// contextWindowURL's server refuses every chat completion as OpenAI
// refuses a prompt longer than the model's context window.
func contextWindowURL(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// A route that cannot work is refused by NewRunner with an error naming
// the kind and what is wrong, before anything runs.
func TestRoutesAreValidatedAtConstruction(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	good := f.candidates(t, f.primaryURL)
	with := func(edit func(c []lease.Candidate) []lease.Candidate) []lease.Candidate {
		return edit(append([]lease.Candidate(nil), good...))
	}
	for _, tc := range []struct {
		name  string
		route lease.Route
		kind  string
		want  string
	}{
		{name: "empty", route: lease.Route{}, want: `Admission.Routes["extract"]: no candidates`},
		{name: "no adapter", route: lease.Route{Candidates: with(func(c []lease.Candidate) []lease.Candidate {
			c[1].Adapter = nil
			return c
		})}, want: `Candidates[1] ("secondary") has no Adapter`},
		{name: "no model", route: lease.Route{Candidates: with(func(c []lease.Candidate) []lease.Candidate {
			c[0].Model = ""
			return c
		})}, want: `Candidates[0] ("primary").Model`},
		{name: "one pool two models", route: lease.Route{Candidates: with(func(c []lease.Candidate) []lease.Candidate {
			c[1].Pool = "primary"
			return c
		})}, want: `pool "primary" serves model "gpt-fake" in another candidate`},
		{name: "names twice", route: lease.Route{Candidates: with(func(c []lease.Candidate) []lease.Candidate {
			c[1].Name = "primary"
			return c
		})}, want: `the name "primary" is used twice`},
		{name: "pin", route: lease.Route{Candidates: good, Pin: "tertiary"}, want: `Pin "tertiary" names no candidate`},
		{name: "move on", route: lease.Route{Candidates: good, MoveOn: []lease.Failure{"invalid_output"}}, want: `MoveOn: "invalid_output" is not a Failure`},
		{name: "kind without handler", kind: "summarise", route: lease.Route{Candidates: good}, want: `Admission.Routes["summarise"]: no handler of that kind`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kind := tc.kind
			if kind == "" {
				kind = "extract"
			}
			cfg := fastConfig(map[string]lease.Handler{"extract": extract()})
			cfg.Admission = &lease.Admission{Limiter: f.limiter, Routes: map[string]lease.Route{kind: tc.route}}
			_, err := lease.NewRunner(f.pool, f.store, cfg)
			require.ErrorIs(t, err, lease.ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A pool the limiter does not know makes Run return at once, naming it,
// before anything is claimed.
func TestRouteToAnUnknownPoolStopsRun(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	candidates := f.candidates(t, f.primaryURL)
	candidates[1].Pool = "tertiary"
	cfg := fastConfig(map[string]lease.Handler{"extract": extract()})
	cfg.Admission = &lease.Admission{Limiter: f.limiter, Routes: map[string]lease.Route{"extract": {Candidates: candidates}}}
	runner, err := lease.NewRunner(f.pool, f.store, cfg)
	require.NoError(t, err)
	job := f.enqueueDocument(invoice)
	err = runner.Run(t.Context())
	require.ErrorIs(t, err, lease.ErrInvalidConfig)
	require.ErrorIs(t, err, admission.ErrUnknownPool)
	require.ErrorContains(t, err, `Admission.Routes["extract"]: candidate "secondary": pool "tertiary" does not exist`)
	require.Empty(t, f.attempts(job.ID), "nothing was claimed")
}

// countingLimiter counts the limiter calls a runner makes.
type countingLimiter struct {
	admission.Limiter
	acquires, readies atomic.Int64
}

func (c *countingLimiter) Acquire(ctx context.Context, req admission.Request) (*admission.Permit, error) {
	c.acquires.Add(1)
	return c.Limiter.Acquire(ctx, req)
}

func (c *countingLimiter) Ready(ctx context.Context, pool string, tokens int64) error {
	c.readies.Add(1)
	return c.Limiter.Ready(ctx, pool, tokens)
}

// When the first candidate grants, a routed attempt asks the limiter
// exactly what an attempt with one pool does: one acquire, no question
// about the other candidates.
func TestRoutingAddsNoLimiterCallWhenThePrimaryGrants(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	const n = 5
	run := func(admit func(*lease.Admission)) (acquires, readies int64) {
		counting := &countingLimiter{Limiter: f.limiter}
		cfg := fastConfig(map[string]lease.Handler{"extract": extract()})
		cfg.Admission = &lease.Admission{Limiter: counting}
		admit(cfg.Admission)
		_, stop := f.fixture.start(cfg)
		ids := make([]uuid.UUID, n)
		for i := range ids {
			ids[i] = f.enqueueDocument(invoice).ID
		}
		for _, id := range ids {
			require.Equal(t, jobs.StateSucceeded, f.await(id).State)
		}
		require.NoError(t, stop())
		return counting.acquires.Load(), counting.readies.Load()
	}
	candidates := f.candidates(t, f.primaryURL)
	routed, routedReadies := run(func(a *lease.Admission) { a.Routes = map[string]lease.Route{"extract": {Candidates: candidates}} })
	single, singleReadies := run(func(a *lease.Admission) { a.Routes = map[string]lease.Route{"extract": {Candidates: candidates[:1]}} })
	require.EqualValues(t, n, routed)
	require.Equal(t, single, routed)
	// Run asks once about each pool of its routes before claiming; no
	// queue gate is configured, so the attempts ask nothing else.
	require.EqualValues(t, 2, routedReadies)
	require.EqualValues(t, 1, singleReadies)
	require.Zero(t, f.secondaryHits.Load())
}

// A durable step records the candidate whose call produced it.
func TestStepsRecordTheirCandidate(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	f.primary.Storm(time.Minute)
	handler := extract()
	stepped := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		return lease.Step(ctx, "extract", func(ctx context.Context) (json.RawMessage, error) { return handler(ctx, job) })
	})
	cfg := fastConfig(map[string]lease.Handler{"extract": stepped})
	cfg.Admission = &lease.Admission{Limiter: f.limiter, Routes: map[string]lease.Route{"extract": {Candidates: f.candidates(t, f.primaryURL)}}}
	f.fixture.start(cfg)
	job := f.enqueueDocument(invoice)
	require.Equal(t, jobs.StateSucceeded, f.await(job.ID).State)
	steps, err := f.store.Steps(t.Context(), f.pool, "acme", job.ID)
	require.NoError(t, err)
	require.Len(t, steps, 1)
	require.Equal(t, "secondary", steps[0].Candidate)
}

// No move starts once the job's deadline has passed: a primary that fails
// after it ends the attempt there, and the secondary is never called.
func TestRouteDoesNotMovePastTheJobsDeadline(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	deadline := time.Now().Add(700 * time.Millisecond) // the answer comes before the client's 1s timeout
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // a provider that answers 500 only after the job's deadline
		case <-time.After(time.Until(deadline) + 100*time.Millisecond):
		case <-r.Context().Done():
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":{"message":"internal error","type":"server_error"}}`))
	}))
	t.Cleanup(slow.Close)
	cfg := fastConfig(map[string]lease.Handler{"extract": extract()})
	cfg.AttemptTimeout, cfg.LeaseDuration, cfg.DeadlineMargin = 4*time.Second, 10*time.Second, 100*time.Millisecond
	cfg.Admission = &lease.Admission{Limiter: f.limiter, Routes: map[string]lease.Route{"extract": {Candidates: f.candidates(t, slow.URL+"/v1")}}}
	f.fixture.start(cfg)
	payload, err := json.Marshal(invoice)
	require.NoError(t, err)
	job := f.enqueue(jobs.EnqueueParams{Kind: "extract", Payload: payload, DeadlineAt: deadline})
	a := f.firstAttempt(job.ID)
	require.Equal(t, "primary", a.Candidate)
	require.Empty(t, a.Moves)
	require.Zero(t, f.secondaryHits.Load())
}

// llmq.route.calls counts each candidate's part: a call that moved on, a
// pool passed over while it cools down, a call that served.
func TestRouteCallsAreCounted(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	m := telemetrytest.NewMetrics(t)
	f.primary.Storm(time.Minute) // its 429s cool the primary's pool down for a minute
	cfg := fastConfig(map[string]lease.Handler{"extract": extract()})
	cfg.MeterProvider = m.Provider
	cfg.Admission = &lease.Admission{Limiter: f.limiter, Routes: map[string]lease.Route{"extract": {Candidates: f.candidates(t, f.primaryURL)}}}
	f.fixture.start(cfg)
	for range 2 {
		job := f.enqueueDocument(invoice)
		require.Equal(t, jobs.StateSucceeded, f.await(job.ID).State)
	}
	count := func(candidate, result string) int64 {
		n, _ := m.Collect(t).Int("llmq.route.calls", attribute.String("kind", "extract"),
			attribute.String("candidate", candidate), attribute.String("result", result))
		return n
	}
	require.EqualValues(t, 1, count("primary", "moved_rate_limited"))
	require.EqualValues(t, 1, count("primary", "passed"), "the second attempt finds the pool cooling down")
	require.EqualValues(t, 2, count("secondary", "served"))
	require.EqualValues(t, 1, f.primaryHits.Load())
}

// When every candidate's call is refused with a wait, the job is snoozed
// for the soonest of them: the primary's short cooldown, not the
// secondary's hour.
func TestRouteSnoozesForTheSoonestCooldownAfterMoving(t *testing.T) {
	t.Parallel()
	f := newRouteFixture(t)
	f.primary.Storm(5 * time.Second)
	f.secondary.Storm(time.Hour)
	f.start(lease.Route{Candidates: f.candidates(t, f.primaryURL)})
	job := f.enqueueDocument(invoice)
	a := f.firstAttempt(job.ID)
	require.Equal(t, jobs.AttemptSnoozed, a.Outcome, a.Error)
	require.Equal(t, "secondary", a.Candidate)
	require.Len(t, a.Moves, 1)
	require.Equal(t, "rate_limited", a.Moves[0].Failure)
	require.Less(t, a.RetryAt.Sub(a.EndedAt), 6*time.Second, "snoozed for the primary's cooldown")
}
