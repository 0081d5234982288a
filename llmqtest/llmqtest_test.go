package llmqtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtest"
)

type extractArgs struct {
	Document string `json:"document"`
}

type totals struct {
	Total string `json:"total"`
}

var extractKind = jobs.NewKind[extractArgs, totals]("invoice.extract")

// failsOnce is a handler whose first attempt of each job fails.
func failsOnce(_ context.Context, job *jobs.Job, args extractArgs) (totals, error) {
	if job.Attempt == 1 {
		return totals{}, errors.New("provider: 503")
	}
	return totals{Total: "total of " + args.Document}, nil
}

// Two databases held at once are two schemas.
func TestNewDBSchemasAreExclusive(t *testing.T) {
	t.Parallel()
	a, b := llmqtest.NewDB(t), llmqtest.NewDB(t)
	require.NotEqual(t, a.Schema, b.Schema)
}

// WorkUntilIdle returns once the retried job succeeded, and leaves a job
// of a kind it does not serve alone.
func TestWorkUntilIdleRunsRetriesToTheEnd(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	res, err := extractKind.Enqueue(ctx, store, db.Pool, "acme", extractArgs{Document: "a.pdf"}, jobs.EnqueueOptions{})
	require.NoError(t, err)
	other, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "unserved"})
	require.NoError(t, err)

	logs := &logTB{TB: t}
	llmqtest.WorkUntilIdle(ctx, logs, db, store, lease.Config{Handlers: lease.Kinds(lease.Handle(extractKind, failsOnce))})
	require.Contains(t, logs.String(), `jobs of kinds ["unserved"] wait in queues [default] with no handler in this runner (it has ["invoice.extract"])`)

	job := llmqtest.Job(ctx, t, db.Pool, store, res.Job)
	require.Equal(t, jobs.StateSucceeded, job.State)
	result, err := extractKind.Result(job)
	require.NoError(t, err)
	require.Equal(t, totals{Total: "total of a.pdf"}, result)
	attempts := llmqtest.Attempts(ctx, t, db.Pool, store, job)
	require.Len(t, attempts, 2)
	require.Equal(t, jobs.ClassTransient, attempts[0].ErrorClass)
	require.Equal(t, jobs.StateReady, llmqtest.Job(ctx, t, db.Pool, store, other.Job).State)
}

// Steps reads what a handler's durable steps stored: the retry reused the
// step its first attempt ran.
func TestStepsOfAJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	res, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "ocr"})
	require.NoError(t, err)
	handler := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		text, err := lease.Step(ctx, "ocr", func(context.Context) (string, error) { return "INVOICE", nil })
		if err != nil {
			return nil, err
		}
		if job.Attempt == 1 {
			return nil, errors.New("the next step failed")
		}
		return json.Marshal(text)
	})
	llmqtest.WorkUntilIdle(ctx, t, db, store, lease.Config{Handlers: map[string]lease.Handler{"ocr": handler}})
	steps := llmqtest.Steps(ctx, t, db.Pool, store, res.Job)
	require.Len(t, steps, 1)
	require.Equal(t, 1, steps[0].Attempt)
	require.Equal(t, []int{2}, steps[0].ReusedBy)
}

// What a transaction enqueued is seen on it before it commits, and not
// outside it.
func TestRequireEnqueuedSeesTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := extractKind.Enqueue(ctx, store, tx, "acme", extractArgs{Document: "b.pdf"}, jobs.EnqueueOptions{})
	require.NoError(t, err)

	job, args := llmqtest.RequireEnqueued(ctx, t, tx, store, "acme", extractKind)
	require.Equal(t, res.Job.ID, job.ID)
	require.Equal(t, extractArgs{Document: "b.pdf"}, args)
	llmqtest.RequireNotEnqueued(ctx, t, db.Pool, store, "acme", extractKind)
	llmqtest.RequireEvent(ctx, t, tx, db.Outbox(t), job.ID, "invoice.extract.requested")
}

// A failed requirement names what there is instead: the kinds the tenant
// has, the event types there are.
func TestRequireFailuresSayWhatThereIs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := llmqtest.NewDB(t)
	store := db.Jobs(t)
	res, err := extractKind.Enqueue(ctx, store, db.Pool, "acme", extractArgs{}, jobs.EnqueueOptions{})
	require.NoError(t, err)
	misspelt := jobs.NewKind[extractArgs, totals]("invoice.extarct")

	msg := fatalOf(t, func(tb testing.TB) {
		tb.Helper()
		llmqtest.RequireEnqueued(ctx, tb, db.Pool, store, "acme", misspelt)
	})
	require.Contains(t, msg, `no job of kind "invoice.extarct" enqueued for tenant "acme"; its jobs have kinds [invoice.extract]`)
	msg = fatalOf(t, func(tb testing.TB) {
		tb.Helper()
		llmqtest.RequireNotEnqueued(ctx, tb, db.Pool, store, "acme", extractKind)
	})
	require.Contains(t, msg, "expected none")
	msg = fatalOf(t, func(tb testing.TB) {
		tb.Helper()
		llmqtest.RequireEvent(ctx, tb, db.Pool, db.Outbox(t), res.Job.ID, "invoice.extract.succeeded")
	})
	require.Contains(t, msg, `there are ["invoice.extract.requested"]`)
}

// Inline runs the handler through the typed adapter: a payload that does
// not decode is a malformed-payload failure, and fn is not called.
func TestInlineDecodesAndEncodes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r, err := llmqtest.Inline(ctx, t, extractKind, failsOnce, extractArgs{Document: "c.pdf"})
	require.EqualError(t, err, "provider: 503")
	require.Zero(t, r)

	called := false
	job := &jobs.Job{ID: uuid.New(), Kind: extractKind.Name(), Attempt: 2, Payload: []byte(`{"document": 5}`)}
	_, err = llmqtest.InlineJob(ctx, t, extractKind, func(context.Context, *jobs.Job, extractArgs) (totals, error) {
		called = true
		return totals{}, nil
	}, job)
	var malformed *jobs.MalformedPayloadError
	require.ErrorAs(t, err, &malformed)
	require.False(t, called)
	class, _ := jobs.Classify(err)
	require.Equal(t, jobs.ClassMalformedPayload, class)

	job.Payload = []byte(`{"document": "c.pdf"}`)
	r, err = llmqtest.InlineJob(ctx, t, extractKind, failsOnce, job)
	require.NoError(t, err)
	require.Equal(t, totals{Total: "total of c.pdf"}, r)
}

// logTB records what is logged through it.
type logTB struct {
	testing.TB
	mu   sync.Mutex
	logs []string
}

func (l *logTB) Logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.logs = append(l.logs, fmt.Sprintf(format, args...))
}

func (l *logTB) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.logs, "\n")
}

// fatalTB records the first Fatalf and ends its goroutine, as testing.T
// does.
type fatalTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// fatalOf runs fn with a TB that records its Fatalf, and returns the
// message, failing t when fn did not fail.
func fatalOf(t *testing.T, fn func(testing.TB)) string {
	t.Helper()
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(tb)
	}()
	<-done
	tb.mu.Lock()
	defer tb.mu.Unlock()
	require.NotEmpty(t, tb.msg, "expected the helper to fail the test")
	return tb.msg
}
