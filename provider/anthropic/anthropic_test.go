package anthropic_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
	"github.com/llmq/llmq/provider/internal/providertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client is an anthropic-sdk-go client under the adapter, on the server
// at baseURL (…/v1; the SDK adds v1/messages to the server's root).
func client(t *testing.T, baseURL string, cfg llmqanthropic.Config) sdk.Client {
	t.Helper()
	opts, err := llmqanthropic.Options(cfg)
	require.NoError(t, err)
	return sdk.NewClient(append([]option.RequestOption{
		option.WithBaseURL(strings.TrimSuffix(baseURL, "/v1")), option.WithAPIKey("key-1"),
		option.WithHTTPClient(providertest.HTTPClient(t)),
	}, opts...)...)
}

// complete is a handler's provider call: one message about text through
// the adapter, within 2s. It sends the error the adapter returned on errs.
func complete(c sdk.Client, text string, errs chan<- error) lease.HandlerFunc {
	return func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		params := sdk.MessageNewParams{Model: "m", MaxTokens: 800, System: []sdk.TextBlockParam{{Text: "extract"}}}
		if text != "" { // without messages the provider answers 400
			params.Messages = []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(text))}
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		msg, err := llmqanthropic.Call(ctx, func(ctx context.Context) (*sdk.Message, error) {
			return c.Messages.New(ctx, params)
		})
		errs <- err
		if err != nil {
			return nil, err
		}
		return json.RawMessage(msg.Content[0].Text), nil
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
				var apiErr *sdk.Error
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
			a := e.Attempt(t, complete(client(t, baseURL, llmqanthropic.Config{}), tc.text, errs))
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
			a := e.Attempt(t, complete(client(t, baseURL, llmqanthropic.Config{}), providertest.Document, make(chan error, 1)))
			require.Equal(t, tc.outcome, a.Outcome, "%s", a.Error)
			require.Equal(t, tc.uncertain, a.Usage.Uncertain)
		})
	}
}

// Outside an admitted attempt the responses reach the limiter given in
// Config: a 429's wait cools the pool for every holder, and the call's
// error snoozes.
func TestObserveOutsideAttempt(t *testing.T) {
	t.Parallel()
	e := providertest.New(t, fakeprovider.Config{})
	e.Provider.Storm(30 * time.Second)
	c := client(t, e.URL, llmqanthropic.Config{Limiter: e.Limiter, Pool: providertest.Pool})
	_, err := llmqanthropic.Call(t.Context(), func(ctx context.Context) (*sdk.Message, error) {
		return c.Messages.New(ctx, sdk.MessageNewParams{Model: "m", MaxTokens: 10, Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("hi"))}})
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
	_, err = llmqanthropic.Options(llmqanthropic.Config{Limiter: l})
	require.ErrorIs(t, err, llmqanthropic.ErrInvalidConfig)
}

func FuzzUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"input_tokens":12,"output_tokens":3,"cache_read_input_tokens":100}}`))
	f.Add([]byte(`{"usage":{"input_tokens":9223372036854775807,"output_tokens":-1,"cache_creation_input_tokens":5}}`))
	f.Add([]byte(`{"usage":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		u, ok := llmqanthropic.Usage(body)
		if !ok {
			require.Zero(t, u)
			return
		}
		require.GreaterOrEqual(t, u.InputTokens, int64(0))
		require.GreaterOrEqual(t, u.OutputTokens, int64(0))
		require.False(t, u.Uncertain)
	})
}

// A prompt past the model's context window is refused with a 400 whose
// message says so: the adapter's error matches lease.ErrContextWindow, so
// a route may move the attempt to a model with a larger window.
func TestContextWindowRefusal(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`))
	}))
	t.Cleanup(srv.Close)
	c, err := llmqanthropic.NewClient(llmqanthropic.Config{}, option.WithBaseURL(srv.URL), option.WithAPIKey("key-1"),
		option.WithHTTPClient(providertest.HTTPClient(t)))
	require.NoError(t, err)
	require.Equal(t, "anthropic", c.Provider())
	_, err = llmqanthropic.Call(t.Context(), func(ctx context.Context) (*sdk.Message, error) {
		return c.Messages.New(ctx, sdk.MessageNewParams{Model: "m", MaxTokens: 10,
			Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock("long"))}})
	})
	require.ErrorIs(t, err, lease.ErrContextWindow)
	class, _ := jobs.Classify(err)
	require.Equal(t, jobs.ClassPermanent, class)
}
