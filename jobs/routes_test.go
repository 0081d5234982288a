package jobs_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// routeColumnsNull says whether an attempt's route columns are all NULL.
func (f *fixture) routeColumnsNull(t *testing.T, id uuid.UUID, attempt int) bool {
	t.Helper()
	var null bool
	require.NoError(t, f.pool.QueryRow(t.Context(),
		"SELECT candidate IS NULL AND model IS NULL AND moves IS NULL FROM "+f.schema+".job_attempts WHERE job_id = $1 AND attempt = $2",
		id, attempt).Scan(&null))
	return null
}

// An attempt records the candidate that served it, its model and the moves
// before it; one without a route, completed in the same batch, records
// nothing of the kind and leaves the columns NULL.
func TestCompleteRecordsTheRoute(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{{Tenant: "acme", Kind: "k"}, {Tenant: "acme", Kind: "k"}})
	require.NoError(t, err)
	routed, plain := f.claim(t, "w"), f.claim(t, "w")

	longError := "x" + strings.Repeat("é", jobs.MaxMoveErrorLen) // cut inside a character
	moves := []jobs.Move{
		{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "rate_limited", Error: "429: slow down \x00 \xff",
			InputTokens: 1200, Uncertain: true},
		{Candidate: "openai-us", Model: "gpt-large", Failure: "context_window", Error: longError, InputTokens: 9000, OutputTokens: 3},
		{Candidate: "openai-eu", Failure: "timeout"},
	}
	c := succeeded(routed, `{"total":"41.00"}`)
	c.Candidate, c.Model, c.Moves = "local", "llama-70b", moves
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{c, succeeded(plain, `{}`)})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
	require.NoError(t, out[1].Err)

	attempts, err := f.store.Attempts(ctx, f.pool, "acme", routed.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	a := attempts[0]
	require.Equal(t, jobs.AttemptSucceeded, a.Outcome)
	require.Equal(t, "local", a.Candidate)
	require.Equal(t, "llama-70b", a.Model)
	require.Len(t, a.Moves, 3)
	require.Equal(t, jobs.Move{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "rate_limited",
		Error: "429: slow down \uFFFD \uFFFD", InputTokens: 1200, Uncertain: true}, a.Moves[0], "an error text is made storable")
	require.Equal(t, jobs.Move{Candidate: "openai-eu", Failure: "timeout"}, a.Moves[2])
	cut := a.Moves[1].Error
	require.LessOrEqual(t, len(cut), jobs.MaxMoveErrorLen, "a long error text is cut, not refused")
	require.Greater(t, len(cut), jobs.MaxMoveErrorLen-utf8.UTFMax)
	require.True(t, utf8.ValidString(cut), "at a character's boundary")
	require.True(t, strings.HasPrefix(longError, cut))
	a.Moves[1].Error = ""
	require.Equal(t, jobs.Move{Candidate: "openai-us", Model: "gpt-large", Failure: "context_window", InputTokens: 9000, OutputTokens: 3}, a.Moves[1])

	var kind string
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT jsonb_typeof(moves) FROM "+f.schema+".job_attempts WHERE job_id = $1", routed.ID).Scan(&kind))
	require.Equal(t, "array", kind, "the moves are one JSON array")

	attempts, err = f.store.Attempts(ctx, f.pool, "acme", plain.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	require.Empty(t, attempts[0].Candidate)
	require.Empty(t, attempts[0].Model)
	require.Nil(t, attempts[0].Moves)
	require.True(t, f.routeColumnsNull(t, plain.ID, 1), "an attempt without a route writes NULLs")

	raw, err := json.Marshal(attempts[0])
	require.NoError(t, err)
	require.NotContains(t, string(raw), "candidate", "nor shows them in JSON")
	require.NotContains(t, string(raw), "moves")
}

// Each attempt of a retried job records its own route: the first one's
// candidate and moves stay on its row when the second is served by
// another, and a served attempt without moves stores none.
func TestEachAttemptRecordsItsRoute(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	first, _ := f.claimNew(t, "w")
	retry := jobs.Completion{Lease: jobs.Lease{JobID: first.ID, Fence: first.Fence}, Attempt: first.Attempt, Worker: "w",
		Outcome: jobs.OutcomeRetry, ErrorClass: jobs.ClassTransient, Error: "every candidate failed",
		Candidate: "openai-us", Model: "gpt-large", Moves: []jobs.Move{{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "server_error", Error: "529"}}}
	out, err := f.store.Complete(ctx, f.pool, []jobs.Completion{retry})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)
	f.setState(t, first.ID, "available_at = now()")

	second := f.claim(t, "w")
	require.Equal(t, 2, second.Attempt)
	c := succeeded(second, `{}`)
	c.Candidate, c.Model = "anthropic-eu", "claude-sonnet"
	out, err = f.store.Complete(ctx, f.pool, []jobs.Completion{c})
	require.NoError(t, err)
	require.NoError(t, out[0].Err)

	attempts, err := f.store.Attempts(ctx, f.pool, "acme", first.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.AttemptRetryScheduled, attempts[0].Outcome)
	require.Equal(t, "openai-us", attempts[0].Candidate)
	require.Equal(t, []jobs.Move{{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "server_error", Error: "529"}}, attempts[0].Moves)
	require.Equal(t, "anthropic-eu", attempts[1].Candidate)
	require.Equal(t, "claude-sonnet", attempts[1].Model)
	require.Nil(t, attempts[1].Moves)
	var movesNull bool
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT moves IS NULL FROM "+f.schema+".job_attempts WHERE job_id = $1 AND attempt = 2", first.ID).Scan(&movesNull))
	require.True(t, movesNull, "an attempt that made no move stores no moves")
}

// A step records the candidate whose call produced it; TakeStep and Steps
// read it back, and a step outside a route leaves the column NULL.
func TestStepRecordsItsCandidate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	j, lease := f.claimNew(t, "w")
	saved, err := f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: lease, Name: "extract",
		Output: json.RawMessage(`{"total":1}`), Usage: jobs.Usage{InputTokens: 10}, Candidate: "openai-us"})
	require.NoError(t, err)
	require.Equal(t, "openai-us", saved.Candidate)
	_, err = f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: lease, Name: "ocr", Output: json.RawMessage(`"text"`)})
	require.NoError(t, err)

	again, err := f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: lease, Name: "extract",
		Output: json.RawMessage(`{"total":2}`), Candidate: "anthropic-eu"})
	require.NoError(t, err)
	require.Equal(t, "openai-us", again.Candidate, "the first store wins, candidate and all")

	taken, found, err := f.store.TakeStep(ctx, f.pool, jobs.StepParams{Lease: lease, Name: "extract"})
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "openai-us", taken.Candidate)

	steps, err := f.store.Steps(ctx, f.pool, "acme", j.ID)
	require.NoError(t, err)
	require.Len(t, steps, 2)
	byName := map[string]jobs.Step{}
	for _, s := range steps {
		byName[s.Name] = s
	}
	require.Equal(t, "openai-us", byName["extract"].Candidate)
	require.Empty(t, byName["ocr"].Candidate)

	var null bool
	require.NoError(t, f.pool.QueryRow(ctx, "SELECT candidate IS NULL FROM "+f.schema+".job_steps WHERE job_id = $1 AND name = 'ocr'", j.ID).Scan(&null))
	require.True(t, null, "a step outside a route stores NULL")
}

// Validate refuses what a completion records of a route that the store
// should not keep, naming the field; Complete refuses the whole batch
// before writing anything.
func TestCompletionValidateRoute(t *testing.T) {
	t.Parallel()
	base := func() jobs.Completion {
		return jobs.Completion{Attempt: 1, Worker: "w", Outcome: jobs.OutcomeSucceeded, Candidate: "openai-us", Model: "gpt-large",
			Moves: []jobs.Move{{Candidate: "anthropic-eu", Model: "claude-sonnet", Failure: "rate_limited"}}}
	}
	require.NoError(t, base().Validate())
	long := strings.Repeat("c", jobs.MaxCandidateLen+1)
	for _, tc := range []struct {
		name  string
		edit  func(c *jobs.Completion)
		field string
	}{
		{"overlong candidate", func(c *jobs.Completion) { c.Candidate = long }, "Candidate"},
		{"candidate with a control character", func(c *jobs.Completion) { c.Candidate = "a\nb" }, "Candidate"},
		{"candidate not UTF-8", func(c *jobs.Completion) { c.Candidate = "a\xff" }, "Candidate"},
		{"overlong model", func(c *jobs.Completion) { c.Model = long }, "Model"},
		{"model with a control character", func(c *jobs.Completion) { c.Model = "gpt\x00" }, "Model"},
		{"model without candidate", func(c *jobs.Completion) { c.Candidate = "" }, "Model"},
		{"too many moves", func(c *jobs.Completion) {
			c.Moves = make([]jobs.Move, jobs.MaxMoves+1)
			for i := range c.Moves {
				c.Moves[i] = jobs.Move{Candidate: "c", Failure: "timeout"}
			}
		}, "Moves"},
		{"move without candidate", func(c *jobs.Completion) { c.Moves[0].Candidate = "" }, "Moves[0].Candidate"},
		{"move with an overlong candidate", func(c *jobs.Completion) { c.Moves[0].Candidate = long }, "Moves[0].Candidate"},
		{"move with an overlong model", func(c *jobs.Completion) { c.Moves[0].Model = long }, "Moves[0].Model"},
		{"move with a control character in its model", func(c *jobs.Completion) { c.Moves[0].Model = "m\t" }, "Moves[0].Model"},
		{"move without failure", func(c *jobs.Completion) {
			c.Moves = append(c.Moves, jobs.Move{Candidate: "c"})
		}, "Moves[1].Failure"},
		{"move with negative input tokens", func(c *jobs.Completion) { c.Moves[0].InputTokens = -1 }, "Moves[0].InputTokens"},
		{"move with negative output tokens", func(c *jobs.Completion) { c.Moves[0].OutputTokens = -1 }, "Moves[0].OutputTokens"},
	} {
		c := base()
		tc.edit(&c)
		err := c.Validate()
		var invalid *llmqtype.ValidationError
		require.ErrorAs(t, err, &invalid, tc.name)
		require.Equal(t, tc.field, invalid.Field, tc.name)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, tc.name)
		require.Contains(t, err.Error(), tc.field, "%s: the message names the field", tc.name)
	}

	c := base()
	c.Candidate = ""
	c.Model = ""
	c.Moves[0].Error = strings.Repeat("e", 10*jobs.MaxMoveErrorLen) + "\x00\xff"
	require.NoError(t, c.Validate(), "a route's moves without a serving candidate, and any error text, are accepted")
	c.Moves = make([]jobs.Move, jobs.MaxMoves)
	for i := range c.Moves {
		c.Moves[i] = jobs.Move{Candidate: "c", Failure: "timeout"}
	}
	require.NoError(t, c.Validate(), "MaxMoves moves are accepted")
}

// Complete refuses a batch holding a completion with a bad route before
// writing anything, naming the completion and the field.
func TestCompleteRefusesABadRoute(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	_, err := f.store.EnqueueMany(ctx, f.pool, []jobs.EnqueueParams{{Tenant: "acme", Kind: "k"}, {Tenant: "acme", Kind: "k"}})
	require.NoError(t, err)
	a, b := f.claim(t, "w"), f.claim(t, "w")
	bad := succeeded(b, `{}`)
	bad.Moves = []jobs.Move{{Candidate: "c", Failure: "timeout"}, {Candidate: "c"}}
	_, err = f.store.Complete(ctx, f.pool, []jobs.Completion{succeeded(a, `{}`), bad})
	require.ErrorIs(t, err, jobs.ErrInvalidParams)
	require.ErrorContains(t, err, "completions[1].Moves[1].Failure")
	require.Zero(t, f.count(t, "job_attempts"), "nothing was written")
}

// A step's candidate is checked like the completion's.
func TestSaveStepRejectsABadCandidate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, lease := f.claimNew(t, "w")
	for name, candidate := range map[string]string{
		"overlong":          strings.Repeat("c", jobs.MaxCandidateLen+1),
		"control character": "a\x1fb",
	} {
		_, err := f.store.SaveStep(t.Context(), f.pool, jobs.SaveStepParams{Lease: lease, Name: "s", Output: json.RawMessage(`1`), Candidate: candidate})
		var invalid *llmqtype.ValidationError
		require.ErrorAs(t, err, &invalid, name)
		require.Equal(t, "Candidate", invalid.Field, name)
		require.ErrorIs(t, err, jobs.ErrInvalidParams, name)
	}
	require.Zero(t, f.count(t, "job_steps"), "nothing was written")
}

// FuzzMovesAreStorable checks that whatever a move's error text holds,
// the moves Complete stores are JSON that jsonb accepts, with the text
// made storable and cut at a character's boundary to MaxMoveErrorLen
// bytes, and everything else kept.
//
//	go test -run '^$' -fuzz FuzzMovesAreStorable ./jobs
func FuzzMovesAreStorable(f *testing.F) {
	for _, seed := range []string{"", "429 Too Many Requests", "nul \x00 here", "\xff\xfe", strings.Repeat("é", 700), "\u2028<&>\"\\"} {
		f.Add(seed, int64(1), false)
	}
	f.Fuzz(func(t *testing.T, text string, tokens int64, uncertain bool) {
		if tokens < 0 {
			tokens = ^tokens // negative counts are refused; see TestCompletionValidateRoute
		}
		in := []jobs.Move{{Candidate: "c", Model: "m", Failure: "timeout", Error: text, InputTokens: tokens, OutputTokens: tokens, Uncertain: uncertain}}
		c := jobs.Completion{Attempt: 1, Worker: "w", Outcome: jobs.OutcomeRetry, Candidate: "d", Moves: in}
		require.NoError(t, c.Validate(), "an error text is never refused")
		stored, err := jobs.MovesJSONForTest(in)
		require.NoError(t, err)
		problem, _ := validate.JSON([]byte(stored), len(stored))
		require.Empty(t, problem, "%q is stored as %q", text, stored)
		var out []jobs.Move
		require.NoError(t, json.Unmarshal([]byte(stored), &out))
		require.Len(t, out, 1)
		storable := validate.MakeStorable(text)
		require.True(t, strings.HasPrefix(storable, out[0].Error))
		require.True(t, utf8.ValidString(out[0].Error))
		require.LessOrEqual(t, len(out[0].Error), jobs.MaxMoveErrorLen)
		if len(storable) <= jobs.MaxMoveErrorLen {
			require.Equal(t, storable, out[0].Error)
		}
		out[0].Error = in[0].Error
		require.Equal(t, in, out)
	})
}
