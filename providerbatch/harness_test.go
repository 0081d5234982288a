package providerbatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	llmqopenai "github.com/llmq/llmq/provider/openai"
	"github.com/llmq/llmq/providerbatch"
)

func TestMain(m *testing.M) {
	if point := os.Getenv(childEnv); point != "" {
		os.Exit(runChildSubmitter(point))
	}
	goleak.VerifyTestMain(m)
}

// The kind every test batches: the fake provider's invoice extraction,
// built and parsed once for both paths.
type docArgs struct {
	Text string `json:"text"`
}

var extractKind = jobs.NewKind[docArgs, fakeprovider.Extraction]("doc.extract")

var extractCall = providerbatch.NewCall(extractKind, llmqopenai.Chat{}, buildExtract, parseExtract)

func buildExtract(_ context.Context, _ *jobs.Job, a docArgs) (oai.ChatCompletionNewParams, error) {
	return oai.ChatCompletionNewParams{
		Model:    "gpt-test",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.SystemMessage("extract"), oai.UserMessage(a.Text)},
	}, nil
}

func parseExtract(_ context.Context, _ *jobs.Job, _ docArgs, c *oai.ChatCompletion) (fakeprovider.Extraction, error) {
	var ex fakeprovider.Extraction
	content := c.Choices[0].Message.Content
	if err := json.Unmarshal([]byte(content), &ex); err != nil {
		return ex, jobs.InvalidOutput(fmt.Errorf("the extraction is not JSON: %w", err), json.RawMessage(content))
	}
	return ex, nil
}

// invoice is a document the fake model extracts; marker adds a fault.
func invoice(n int, marker string) string {
	return fmt.Sprintf("Supplier: Acme %d\nIBAN: DE89370400440532013000\nInvoice number: INV-%d\nTotal: %d.00 EUR\n%s", n, n, n+1, marker)
}

const (
	batchQueue = "batch"
	pool       = "openai"
)

// harness is one test's database, fake provider and submitter config.
type harness struct {
	t     *testing.T
	db    *dbtest.DB
	store *jobs.PostgresStore
	fake  *fakeprovider.Server
	url   string
	cfg   providerbatch.Config
}

// newHarness serves a fake provider for fcfg (batches complete at their
// first read unless held; synchronous calls take about a millisecond) and
// a submitter config that polls and gathers at every Pass.
func newHarness(t *testing.T, fcfg fakeprovider.Config) *harness {
	t.Helper()
	if fcfg.BatchDelay == 0 {
		fcfg.BatchDelay = time.Nanosecond
	}
	if fcfg.MeanLatency == 0 {
		fcfg.MeanLatency = time.Millisecond // for the synchronous calls some tests make
	}
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 8})
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema, Queues: []string{jobs.DefaultQueue, batchQueue}})
	require.NoError(t, err)
	fake := fakeprovider.New(fcfg)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	h := &harness{t: t, db: db, store: store, fake: fake, url: srv.URL}
	h.cfg = providerbatch.Config{
		Pool: pool, Queue: batchQueue, Provider: h.batches(0), Calls: []providerbatch.KindCall{extractCall.Batch()},
		Schema: db.Schema, ID: "submitter-a",
		GatherInterval: time.Nanosecond, PollMin: time.Nanosecond, PollMax: time.Nanosecond,
	}
	return h
}

// client is an openai-go client of the fake that does not retry.
func (h *harness) client() oai.Client {
	return oai.NewClient(option.WithBaseURL(h.url+"/v1"), option.WithAPIKey("key"), option.WithMaxRetries(0))
}

func (h *harness) batches(enqueuedTokens int64) *llmqopenai.Batches {
	b, err := llmqopenai.NewBatches(h.client(), llmqopenai.BatchesConfig{EnqueuedTokens: enqueuedTokens})
	require.NoError(h.t, err)
	return b
}

func (h *harness) submitter(cfg providerbatch.Config) *providerbatch.Submitter {
	h.t.Helper()
	s, err := providerbatch.NewSubmitter(h.db.Pool, h.store, cfg)
	require.NoError(h.t, err)
	return s
}

// enqueue accepts one batch job per text, needed two days from now.
func (h *harness) enqueue(texts ...string) []uuid.UUID {
	h.t.Helper()
	ids := make([]uuid.UUID, len(texts))
	for i, text := range texts {
		res, err := extractKind.Enqueue(h.t.Context(), h.store, h.db.Pool, "acme", docArgs{Text: text},
			jobs.EnqueueOptions{Queue: batchQueue, DeadlineAt: time.Now().Add(48 * time.Hour), MaxAttempts: 3})
		require.NoError(h.t, err)
		ids[i] = res.Job.ID
	}
	return ids
}

// passUntil steps s until done holds, failing after 200 passes.
func (h *harness) passUntil(s *providerbatch.Submitter, what string, done func() bool) {
	h.t.Helper()
	for range 200 {
		require.NoError(h.t, s.Pass(h.t.Context()))
		if done() {
			return
		}
	}
	h.t.Fatalf("after 200 passes, still not %s: jobs %v, submissions %+v", what, h.states(), h.submissions())
}

// states counts the jobs by state.
func (h *harness) states() map[jobs.State]int {
	h.t.Helper()
	rows, err := h.db.Pool.Query(h.t.Context(), "SELECT state, count(*) FROM "+h.db.Schema+".jobs GROUP BY state")
	require.NoError(h.t, err)
	counts := map[jobs.State]int{}
	for rows.Next() {
		var st string
		var n int
		require.NoError(h.t, rows.Scan(&st, &n))
		counts[jobs.State(st)] = n
	}
	require.NoError(h.t, rows.Err())
	return counts
}

// allIn reports whether all n jobs are in state.
func (h *harness) allIn(state jobs.State, n int) func() bool {
	return func() bool { return h.states()[state] == n }
}

func (h *harness) job(id uuid.UUID) *jobs.Job {
	h.t.Helper()
	j, err := h.store.Get(h.t.Context(), h.db.Pool, "acme", id)
	require.NoError(h.t, err)
	return j
}

func (h *harness) attempts(id uuid.UUID) []jobs.Attempt {
	h.t.Helper()
	a, err := h.store.Attempts(h.t.Context(), h.db.Pool, "acme", id)
	require.NoError(h.t, err)
	return a
}

func (h *harness) submissions() []providerbatch.Submission {
	h.t.Helper()
	op, err := providerbatch.NewOperator(h.db.Schema)
	require.NoError(h.t, err)
	subs, err := op.List(h.t.Context(), h.db.Pool, "", providerbatch.MaxListLimit)
	require.NoError(h.t, err)
	return subs
}

// submission is the submission with id.
func (h *harness) submission(id uuid.UUID) providerbatch.Submission {
	h.t.Helper()
	for _, sub := range h.submissions() {
		if sub.ID == id {
			return sub
		}
	}
	h.t.Fatalf("no submission %s", id)
	return providerbatch.Submission{}
}
