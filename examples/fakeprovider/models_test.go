package fakeprovider_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	antoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	oai "github.com/openai/openai-go/v3"
	oaioption "github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
)

// reply is one synchronous call's answer as an official SDK saw it.
type reply struct {
	status  int
	header  http.Header
	errType string // the error body's type
	errCode string // OpenAI's error code
	errMsg  string
}

// modelDialect is one API called through its official SDK, which never
// retries, and what the API answers for a model without capacity.
type modelDialect struct {
	name       string
	overloaded int    // OutageModel's status
	errType    string // OutageModel's error type
	errCode    string // OutageModel's error code (OpenAI only)
	limitRPM   string // the header with the requests limit
	limitTPM   string // the header with the tokens limit
	remaining  string // the header with the requests remaining
	call       func(t *testing.T, url, model string) reply
}

var modelDialects = []modelDialect{
	{
		name: "openai", overloaded: http.StatusServiceUnavailable, errType: "service_unavailable_error", errCode: "server_is_overloaded",
		limitRPM: "x-ratelimit-limit-requests", limitTPM: "x-ratelimit-limit-tokens", remaining: "x-ratelimit-remaining-requests",
		call: func(t *testing.T, url, model string) reply {
			t.Helper()
			var resp *http.Response
			c := openAIClient(url)
			_, err := c.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{
				Model:    model,
				Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("extract"), oai.UserMessage(doc)},
			}, oaioption.WithResponseInto(&resp))
			if err != nil {
				e := apiError(t, err)
				return reply{status: e.StatusCode, header: e.Response.Header, errType: e.Type, errCode: e.Code, errMsg: e.Message}
			}
			return reply{status: resp.StatusCode, header: resp.Header}
		},
	},
	{
		name: "anthropic", overloaded: 529, errType: "overloaded_error",
		limitRPM: "anthropic-ratelimit-requests-limit", limitTPM: "anthropic-ratelimit-tokens-limit", remaining: "anthropic-ratelimit-requests-remaining",
		call: func(t *testing.T, url, model string) reply {
			t.Helper()
			var resp *http.Response
			c := anthropicClient(url, antoption.WithAPIKey("key-a"))
			_, err := c.Messages.New(t.Context(), sdk.MessageNewParams{
				Model: model, MaxTokens: 800, System: []sdk.TextBlockParam{{Text: "extract"}},
				Messages: []sdk.MessageParam{sdk.NewUserMessage(sdk.NewTextBlock(doc))},
			}, antoption.WithResponseInto(&resp))
			if err != nil {
				var e *sdk.Error
				require.ErrorAs(t, err, &e)
				return reply{status: e.StatusCode, header: e.Response.Header, errType: string(e.Type()), errMsg: e.Message}
			}
			return reply{status: resp.StatusCode, header: resp.Header}
		},
	},
}

// modelServer serves a fake provider for cfg, 15,000 times faster, whose
// call log is the channel returned.
func modelServer(t *testing.T, cfg fakeprovider.Config) (*fakeprovider.Server, string, <-chan fakeprovider.Call) {
	t.Helper()
	calls := make(chan fakeprovider.Call, 100)
	cfg.Scale, cfg.OnCall = 15_000, func(c fakeprovider.Call) { calls <- c }
	srv := fakeprovider.New(cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return srv, hs.URL, calls
}

// nextCalls awaits the next n calls of the log.
func nextCalls(t *testing.T, calls <-chan fakeprovider.Call, n int) []fakeprovider.Call {
	t.Helper()
	out := make([]fakeprovider.Call, 0, n)
	for range n {
		select {
		case c := <-calls:
			out = append(out, c)
		case <-time.After(10 * time.Second):
			require.FailNow(t, "OnCall was not called", "%d of %d calls seen", len(out), n)
		}
	}
	return out
}

// requireLimited requires r to be a 429 whose Retry-After admission reads
// as a cooldown.
func requireLimited(t *testing.T, r reply) {
	t.Helper()
	require.Equal(t, http.StatusTooManyRequests, r.status)
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	require.Positive(t, secs)
	require.NotEmpty(t, r.header.Get("retry-after-ms"))
	require.Positive(t, admission.ParseSignal(r.status, r.header, time.Now()).Cooldown)
}

// Each model Config.Models names has its own RPM and TPM buckets, in both
// APIs, reported in the API's rate-limit headers; a model it does not name
// takes from the server-wide ones, whatever the named ones have left.
// OnCall's log tells the calls' models apart.
func TestModelQuotas(t *testing.T) {
	t.Parallel()
	for _, d := range modelDialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			srv, url, calls := modelServer(t, fakeprovider.Config{
				RPM: 180, // a burst of 3
				Models: map[string]fakeprovider.ModelConfig{
					"model-a": {RPM: 60},   // a burst of 1
					"model-b": {RPM: 120},  // a burst of 2
					"model-t": {TPM: 6000}, // 600 tokens a burst: one call of 800 max tokens
				},
			})
			served := func(model string, rpm, tpm int) {
				t.Helper()
				r := d.call(t, url, model)
				require.Equal(t, http.StatusOK, r.status, "%s: %s", model, r.errMsg)
				require.Equal(t, strconv.Itoa(rpm), r.header.Get(d.limitRPM), model)
				require.Equal(t, strconv.Itoa(tpm), r.header.Get(d.limitTPM), model)
			}
			limited := func(model string, rpm int) {
				t.Helper()
				r := d.call(t, url, model)
				requireLimited(t, r)
				require.Equal(t, strconv.Itoa(rpm), r.header.Get(d.limitRPM), model)
			}

			served("model-a", 60, 1_000_000)
			limited("model-a", 60)
			require.Equal(t, "0", d.call(t, url, "model-a").header.Get(d.remaining))

			served("model-b", 120, 1_000_000)
			served("model-b", 120, 1_000_000)
			limited("model-b", 120)

			served("model-t", 180, 6000) // its RPM is the server's, in a bucket of its own
			limited("model-t", 180)      // out of tokens

			for range 3 {
				served("other", 180, 1_000_000)
			}
			limited("other", 180)

			perModel := map[string]int{}
			for _, c := range nextCalls(t, calls, 12) {
				require.Equal(t, d.name, c.API)
				perModel[c.Model]++
			}
			require.Equal(t, map[string]int{"model-a": 3, "model-b": 3, "model-t": 2, "other": 4}, perModel)
			require.Equal(t, int64(5), srv.Stats().RateLimited)
		})
	}
}

// StormModel refuses one model's calls with 429 and a Retry-After of the
// storm's length while the other model is served; Heal ends it.
func TestStormModel(t *testing.T) {
	t.Parallel()
	for _, d := range modelDialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			srv, url, calls := modelServer(t, fakeprovider.Config{Models: map[string]fakeprovider.ModelConfig{"primary": {RPM: 600}}})
			srv.StormModel("primary", time.Hour)

			r := d.call(t, url, "primary")
			requireLimited(t, r)
			require.Equal(t, "3600", r.header.Get("Retry-After"))
			require.Equal(t, http.StatusOK, d.call(t, url, "secondary").status, "the other model is served")
			requireLimited(t, d.call(t, url, "primary")) // the storm lasts past its first call

			srv.Heal("primary")
			require.Equal(t, http.StatusOK, d.call(t, url, "primary").status)

			log := nextCalls(t, calls, 4)
			require.Equal(t, []string{"rate-limited", "", "rate-limited", ""}, []string{log[0].Fault, log[1].Fault, log[2].Fault, log[3].Fault})
			require.Equal(t, []string{"primary", "secondary", "primary", "primary"}, []string{log[0].Model, log[1].Model, log[2].Model, log[3].Model})
			require.Equal(t, int64(2), srv.Stats().RateLimited)
		})
	}
}

// OutageModel answers one model's calls as the API answers when it has no
// capacity (OpenAI 503, Anthropic 529, each with its error body), which the
// official SDK sees, without taking from the model's quota, while the
// other model is served; Heal ends it, and so does its time running out.
func TestOutageModel(t *testing.T) {
	t.Parallel()
	for _, d := range modelDialects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			srv, url, calls := modelServer(t, fakeprovider.Config{Models: map[string]fakeprovider.ModelConfig{"primary": {RPM: 60}}}) // a burst of 1
			srv.OutageModel("primary", time.Hour)

			for range 2 {
				r := d.call(t, url, "primary")
				require.Equal(t, d.overloaded, r.status)
				require.Equal(t, d.errType, r.errType)
				require.Equal(t, d.errCode, r.errCode)
				require.NotEmpty(t, r.errMsg)
				require.Empty(t, r.header.Get("Retry-After"))
			}
			require.Equal(t, http.StatusOK, d.call(t, url, "secondary").status, "the other model is served")
			log := nextCalls(t, calls, 3)
			for _, c := range log[:2] {
				require.Equal(t, d.name, c.API)
				require.Equal(t, "primary", c.Model)
				require.Equal(t, doc, c.Document)
				require.Equal(t, d.overloaded, c.Status)
				require.Equal(t, "overloaded", c.Fault)
				require.Zero(t, c.PromptTokens)
			}
			require.Equal(t, "secondary", log[2].Model)

			srv.Heal("primary")
			require.Equal(t, http.StatusOK, d.call(t, url, "primary").status, "the outage took nothing from the quota")
			require.Equal(t, fakeprovider.Stats{Calls: 4, Answered: 2, Overloaded: 2}, srv.Stats())

			srv.OutageModel("secondary", 10*time.Millisecond)
			require.Equal(t, d.overloaded, d.call(t, url, "secondary").status)
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polls the condition
				if d.call(t, url, "secondary").status == http.StatusOK {
					break
				}
				require.True(t, time.Now().Before(deadline), "the outage did not end when its time ran out")
			}
		})
	}
}
