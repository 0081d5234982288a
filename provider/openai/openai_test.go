package openai_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/provider/internal/providertest"
	llmqopenai "github.com/llmq/llmq/provider/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client is an openai-go client under the adapter, on baseURL.
func client(t *testing.T, baseURL string, cfg llmqopenai.Config) oai.Client {
	t.Helper()
	opts, err := llmqopenai.Options(cfg)
	require.NoError(t, err)
	return oai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(baseURL), option.WithAPIKey("key-1"),
		option.WithHTTPClient(providertest.HTTPClient(t)), option.WithRequestTimeout(2 * time.Second),
	}, opts...)...)
}

// complete is a handler's provider call: one chat completion of text
// through the adapter. It sends the error the adapter returned on errs.
func complete(c oai.Client, text string, errs chan<- error) lease.HandlerFunc {
	return func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		params := oai.ChatCompletionNewParams{Model: "m", Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("extract")}}
		if text != "" {
			params.Messages = append(params.Messages, oai.UserMessage(text))
		} else {
			params.Messages = nil // the provider refuses a request without messages: 400
		}
		completion, err := llmqopenai.Call(ctx, func(ctx context.Context) (*oai.ChatCompletion, error) {
			return c.Chat.Completions.New(ctx, params)
		})
		errs <- err
		if err != nil {
			return nil, err
		}
		return json.RawMessage(completion.Choices[0].Message.Content), nil
	}
}

// Each way a call can end is classified for the runner, with the permit
// settled to match and exactly one request sent (the SDK's retries are
// off).
func TestClassification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(e *providertest.Env)
		// closed: the client's base URL has no listener; dropping: its
		// server closes the connection once it read the request.
		closed, dropping bool
		text             string
		outcome          jobs.AttemptOutcome
		class            string
		uncertain        bool
		refunded         bool // the permit's whole reservation came back
		requests         int64
		wantErr          func(t *testing.T, err error)
		wantCooling      bool
	}{
		{name: "answered", text: providertest.Document, outcome: jobs.AttemptSucceeded, requests: 1},
		{
			name: "429 with a wait snoozes", setup: func(e *providertest.Env) { e.Provider.Storm(time.Minute) },
			text: providertest.Document, outcome: jobs.AttemptSnoozed, uncertain: true, requests: 1, wantCooling: true,
			wantErr: func(t *testing.T, err error) {
				t.Helper()
				var snooze *jobs.SnoozeError
				require.ErrorAs(t, err, &snooze)
				require.InDelta(t, time.Minute, snooze.After, float64(2*time.Second))
			},
		},
		{
			name: "500 is uncertain", setup: func(e *providertest.Env) { e.Provider.FailNext(1) },
			text: providertest.Document, outcome: jobs.AttemptRetryScheduled, class: jobs.ClassTransient, uncertain: true, requests: 1,
		},
		{
			name: "400 is permanent", outcome: jobs.AttemptFailed, class: jobs.ClassPermanent, refunded: true, requests: 1,
			wantErr: func(t *testing.T, err error) {
				t.Helper()
				var apiErr *oai.Error
				require.ErrorAs(t, err, &apiErr, "the SDK's error stays reachable")
				require.Equal(t, http.StatusBadRequest, apiErr.StatusCode)
			},
		},
		{
			name: "timeout is uncertain", setup: func(e *providertest.Env) { e.Provider.HangNext(1) },
			text: providertest.Document, outcome: jobs.AttemptRetryScheduled, class: jobs.ClassTransient, uncertain: true, requests: 1,
			wantErr: func(t *testing.T, err error) {
				t.Helper()
				require.ErrorIs(t, err, context.DeadlineExceeded)
			},
		},
		{
			name: "lost connection is uncertain", dropping: true,
			text: providertest.Document, outcome: jobs.AttemptRetryScheduled, class: jobs.ClassTransient, uncertain: true,
		},
		{
			name: "connection refused is not sent", closed: true,
			text: providertest.Document, outcome: jobs.AttemptRetryScheduled, class: jobs.ClassTransient, refunded: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			calls := make(chan fakeprovider.Call, 4)
			e := providertest.New(t, fakeprovider.Config{OnCall: func(c fakeprovider.Call) { calls <- c }})
			if tc.setup != nil {
				tc.setup(e)
			}
			baseURL := e.URL
			switch {
			case tc.closed:
				baseURL = providertest.ClosedURL(t)
			case tc.dropping:
				baseURL = providertest.DroppingURL(t)
			}
			errs := make(chan error, 1)
			a := e.Attempt(t, complete(client(t, baseURL, llmqopenai.Config{}), tc.text, errs))
			err := <-errs

			require.Equal(t, tc.outcome, a.Outcome, "%s", a.Error)
			require.Equal(t, tc.class, a.ErrorClass)
			require.Equal(t, tc.uncertain, a.Usage.Uncertain)
			require.Equal(t, tc.requests, e.Requests(), "requests the provider saw")
			if tc.wantErr != nil {
				tc.wantErr(t, err)
			}
			state := e.State(t)
			require.Equal(t, tc.wantCooling, state.Cooldown > 0, "pool cooldown %s", state.Cooldown)
			if tc.outcome == jobs.AttemptSucceeded {
				call := <-calls
				require.Equal(t, call.PromptTokens, a.Usage.InputTokens)
				require.Equal(t, call.CompletionTokens, a.Usage.OutputTokens)
				// Answered: the unused part of the reservation came back.
				used := float64(call.PromptTokens + call.CompletionTokens)
				require.InDelta(t, providertest.Reserve-used, state.TokenLevel, 10)
				return
			}
			require.Zero(t, a.Usage.InputTokens+a.Usage.OutputTokens)
			if tc.refunded {
				require.InDelta(t, providertest.Reserve, state.TokenLevel, 1)
			} else {
				require.Less(t, state.TokenLevel, 10.0, "an uncertain call keeps its reservation")
			}
		})
	}
}

// Without admission the adapter alone says how a call ended: a 429's wait
// snoozes the job, a 500 and a timeout mark the attempt uncertain, and a
// refused connection does not.
func TestClassificationWithoutAdmission(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		setup     func(e *providertest.Env)
		closed    bool
		outcome   jobs.AttemptOutcome
		uncertain bool
	}{
		{name: "429 with a wait snoozes", setup: func(e *providertest.Env) { e.Provider.Storm(time.Minute) }, outcome: jobs.AttemptSnoozed, uncertain: true},
		{name: "500 is uncertain", setup: func(e *providertest.Env) { e.Provider.FailNext(1) }, outcome: jobs.AttemptRetryScheduled, uncertain: true},
		{name: "timeout is uncertain", setup: func(e *providertest.Env) { e.Provider.HangNext(1) }, outcome: jobs.AttemptRetryScheduled, uncertain: true},
		{name: "connection refused is not sent", closed: true, outcome: jobs.AttemptRetryScheduled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := providertest.New(t, fakeprovider.Config{})
			e.Unadmitted = true
			baseURL := e.URL
			if tc.closed {
				baseURL = providertest.ClosedURL(t)
			} else {
				tc.setup(e)
			}
			a := e.Attempt(t, complete(client(t, baseURL, llmqopenai.Config{}), providertest.Document, make(chan error, 1)))
			require.Equal(t, tc.outcome, a.Outcome, "%s", a.Error)
			require.Equal(t, tc.uncertain, a.Usage.Uncertain)
		})
	}
}

// A client built without the adapter's Options passes no request through
// its middleware, so Call cannot tell a call that never left from one lost
// after it was sent: it counts as uncertain, never as not sent (a refund
// of a call that may have been paid).
func TestClientWithoutOptionsIsNeverNotSent(t *testing.T) {
	t.Parallel()
	e := providertest.New(t, fakeprovider.Config{})
	e.Unadmitted = true
	bare := oai.NewClient(option.WithBaseURL(providertest.ClosedURL(t)), option.WithAPIKey("key-1"),
		option.WithHTTPClient(providertest.HTTPClient(t)), option.WithRequestTimeout(2*time.Second), option.WithMaxRetries(0))
	a := e.Attempt(t, complete(bare, providertest.Document, make(chan error, 1)))
	require.Equal(t, jobs.AttemptRetryScheduled, a.Outcome, "%s", a.Error)
	require.True(t, a.Usage.Uncertain, "a call the adapter did not see may have been billed")
}

// Outside an admitted attempt the responses reach the limiter given in
// Config: a 429's wait cools the pool for every holder, and the call's
// error snoozes.
func TestObserveOutsideAttempt(t *testing.T) {
	t.Parallel()
	e := providertest.New(t, fakeprovider.Config{})
	e.Provider.Storm(30 * time.Second)
	c := client(t, e.URL, llmqopenai.Config{Limiter: e.Limiter, Pool: providertest.Pool})
	_, err := llmqopenai.Call(t.Context(), func(ctx context.Context) (*oai.ChatCompletion, error) {
		return c.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{Model: "m", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")}})
	})
	var snooze *jobs.SnoozeError
	require.ErrorAs(t, err, &snooze)
	require.InDelta(t, 30*time.Second, snooze.After, float64(2*time.Second))
	require.InDelta(t, 30*time.Second, e.State(t).Cooldown, float64(2*time.Second))
	var wait *admission.WaitError
	require.ErrorAs(t, e.Limiter.Ready(t.Context(), providertest.Pool, 1), &wait)
	require.Equal(t, admission.ReasonCooldown, wait.Reason)
	require.Equal(t, int64(1), e.Requests())
}

// A Limiter without a Pool is refused before any call.
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	l, err := admission.NewLocal()
	require.NoError(t, err)
	_, err = llmqopenai.Options(llmqopenai.Config{Limiter: l})
	require.ErrorIs(t, err, llmqopenai.ErrInvalidConfig)
}

func FuzzUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":12,"completion_tokens":3}}`))
	f.Add([]byte(`{"usage":{"input_tokens":9223372036854775807,"output_tokens":-1,"prompt_tokens":5}}`))
	f.Add([]byte(`{"usage":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		u, ok := llmqopenai.Usage(body)
		if !ok {
			require.Zero(t, u)
			return
		}
		require.GreaterOrEqual(t, u.InputTokens, int64(0))
		require.GreaterOrEqual(t, u.OutputTokens, int64(0))
		require.False(t, u.Uncertain)
	})
}
