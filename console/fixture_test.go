package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// fixture is one test's schema with a little of everything the console
// shows: two tenants' jobs in two queues in every state, attempts with
// usage, a dead letter and a job awaiting review per tenant, a provider
// pool with a held permit and usage over several days, and provider batch
// submissions in every state.
type fixture struct {
	pool   *pgxpool.Pool
	schema string
	store  *jobs.PostgresStore
	// dead and review are a FAILED_TERMINAL and a REVIEW_REQUIRED job per
	// tenant.
	dead, review map[string]uuid.UUID
	running      uuid.UUID
	// batches are provider batch submissions by name (see seedBatches).
	batches map[string]uuid.UUID
}

var fixtureQueues = []string{"default", "extraction"}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := dbtest.Setup(t)
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema, Queues: fixtureQueues, DisableNotify: true})
	require.NoError(t, err)
	f := &fixture{pool: db.Pool, schema: db.Schema, store: store, dead: map[string]uuid.UUID{}, review: map[string]uuid.UUID{},
		batches: map[string]uuid.UUID{}}
	f.seed(t)
	return f
}

func (f *fixture) seed(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	for _, tenant := range []string{"acme", "globex"} {
		for i := range 6 {
			_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "invoice.extract", Queue: "extraction",
				Payload: []byte(fmt.Sprintf(`{"document":"%s-%d"}`, tenant, i)), EstimatedTokens: 1200})
			require.NoError(t, err)
		}
		_, err := f.store.Enqueue(ctx, f.pool, jobs.EnqueueParams{Tenant: tenant, Kind: "webhook.deliver", Queue: "default",
			Payload: []byte(`{"endpoint":"e1"}`), AvailableAt: time.Now().Add(time.Hour)})
		require.NoError(t, err)
	}
	// Claim four per tenant of the extraction queue and finish them
	// differently; leave one running.
	claimed, err := f.store.Claim(ctx, f.pool, jobs.ClaimParams{Queue: "extraction", Kinds: []string{"invoice.extract"},
		Worker: "worker-a", Limit: 9, LeaseDuration: time.Minute})
	require.NoError(t, err)
	require.Len(t, claimed, 9)
	byTenant := map[string][]*jobs.Job{}
	for _, j := range claimed {
		byTenant[j.Tenant] = append(byTenant[j.Tenant], j)
	}
	var done []jobs.Completion
	for tenant, list := range byTenant {
		require.GreaterOrEqual(t, len(list), 4, tenant)
		usage := jobs.Usage{InputTokens: 1100, OutputTokens: 240}
		done = append(done,
			completion(list[0], jobs.OutcomeSucceeded, "", usage),
			completion(list[1], jobs.OutcomeFailed, "permanent", jobs.Usage{InputTokens: 900, Uncertain: true}),
			completion(list[2], jobs.OutcomeReviewRequired, "invalid_output", usage),
			completion(list[3], jobs.OutcomeRetry, "transient", usage))
		f.dead[tenant], f.review[tenant] = list[1].ID, list[2].ID
		// The dead job's attempt stored its OCR step before its call failed.
		_, err := f.store.SaveStep(ctx, f.pool, jobs.SaveStepParams{Lease: jobs.Lease{JobID: list[1].ID, Fence: list[1].Fence},
			Name: "ocr-pages", Output: []byte(`{"pages":3}`), Usage: jobs.Usage{InputTokens: 700, OutputTokens: 30}})
		require.NoError(t, err)
		if len(list) > 4 {
			f.running = list[4].ID
		}
	}
	res, err := f.store.Complete(ctx, f.pool, done)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	f.seedAdmission(t)
	f.seedBatches(t)
}

func completion(j *jobs.Job, o jobs.CompletionOutcome, class string, u jobs.Usage) jobs.Completion {
	c := jobs.Completion{Lease: jobs.Lease{JobID: j.ID, Fence: j.Fence}, Attempt: j.Attempt, Worker: "worker-a", Outcome: o, Usage: u}
	switch o {
	case jobs.OutcomeSucceeded:
		c.Result = []byte(`{"total":"118.00","currency":"EUR"}`)
	case jobs.OutcomeReviewRequired:
		c.Result = []byte(`{"total":"1.00"}`)
		c.ErrorClass, c.Error = class, "the total does not match the lines"
	default:
		c.ErrorClass, c.Error = class, "provider answered 400: bad request"
		c.RetryDelay = time.Minute
	}
	return c
}

func (f *fixture) seedAdmission(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	lim, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema})
	require.NoError(t, err)
	require.NoError(t, lim.SetPool(ctx, admission.Pool{Name: "openai-gpt", RPM: 600, TPM: 200_000, MaxInFlight: 8,
		InputPrice: 2_500_000, OutputPrice: 10_000_000}))
	for _, tenant := range []string{"acme", "globex"} {
		p, err := lim.Acquire(ctx, admission.Request{Pool: "openai-gpt", Tenant: tenant, Tokens: 1000})
		require.NoError(t, err)
		require.NoError(t, p.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 800, OutputTokens: 150}))
	}
	// A permit still held, and earlier days' usage as the ledger would
	// hold it (Release writes only today's rows).
	_, err = lim.Acquire(ctx, admission.Request{Pool: "openai-gpt", Tenant: "acme", Tokens: 500})
	require.NoError(t, err)
	_, err = f.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.admission_usage (tenant, pool, day, shard, attempts, input_tokens, output_tokens, cost)
		SELECT t, 'openai-gpt', current_date - d, 0, 10 * d, 9000 * d, 2000 * d, (9000 * d * 2.5 + 2000 * d * 10)::bigint
		FROM unnest(ARRAY['acme', 'globex']) AS t, generate_series(1, 6) AS d`, f.schema))
	require.NoError(t, err)
}

// seedBatches records provider batch submissions as package providerbatch
// writes them, newest first: "preparing" (openai-gpt, not yet at the
// provider), "submitted" (openai-gpt, polled, with a two-line last error),
// "claude" (anthropic-claude, submitted, its cancel requested) and "ended"
// (openai-gpt, every request settled).
func (f *fixture) seedBatches(t *testing.T) {
	t.Helper()
	for _, b := range []struct {
		name, pool, provider, model, state, batchID, status, lastError string
		requests, succeeded, failed, stale, returned, skipped          int
		cancel                                                         bool
		age                                                            time.Duration
	}{
		{name: "ended", pool: "openai-gpt", provider: "openai", model: "gpt-4o-mini", state: "ended", batchID: "batch_ended01", status: "completed",
			requests: 40, succeeded: 35, failed: 3, stale: 1, skipped: 1, age: 3 * time.Hour},
		{name: "claude", pool: "anthropic-claude", provider: "anthropic", model: "claude-haiku", state: "submitted", batchID: "msgbatch_01", status: "in_progress",
			requests: 12, cancel: true, age: 2 * time.Hour},
		{name: "submitted", pool: "openai-gpt", provider: "openai", model: "gpt-4o-mini", state: "submitted", batchID: "batch_abc123", status: "in_progress",
			requests: 120, succeeded: 20, failed: 2, returned: 4, lastError: "polling the provider: 502 bad gateway\nretried at the next poll", age: time.Hour},
		{name: "preparing", pool: "openai-gpt", provider: "openai", model: "gpt-4o", state: "preparing", requests: 7, age: 5 * time.Minute},
	} {
		id := uuid.Must(uuid.NewV7())
		f.batches[b.name] = id
		created := time.Now().Add(-b.age)
		var submitted, ended *time.Time
		if b.state != "preparing" {
			submitted = &created
		}
		if b.state == "ended" {
			ended = &created
		}
		_, err := f.pool.Exec(t.Context(), `INSERT INTO `+f.schema+`.provider_submissions (id, pool, provider, model, queue, state,
				provider_batch_id, provider_status, requests, bytes, estimated_tokens, succeeded, failed, stale, returned, skipped,
				cancel_requested, last_error, created_at, submitted_at, ended_at, next_poll_at)
			VALUES ($1, $2, $3, $4, 'batch', $5, NULLIF($6, ''), NULLIF($7, ''), $8, $8 * 2000, $8 * 500, $9, $10, $11, $12, $13,
				$14, NULLIF($15, ''), $16, $17, $18, now() + interval '1 minute')`,
			id, b.pool, b.provider, b.model, b.state, b.batchID, b.status, b.requests, b.succeeded, b.failed, b.stale, b.returned, b.skipped,
			b.cancel, b.lastError, created, submitted, ended)
		require.NoError(t, err, b.name)
	}
}

// console builds a console on the fixture's schema.
func (f *fixture) console(t *testing.T, cfg console.Config) http.Handler {
	t.Helper()
	cfg.DB, cfg.Schema = f.pool, f.schema
	if cfg.EnableActions && cfg.Actor == nil {
		cfg.Actor = func(r *http.Request) string { return r.Header.Get("X-Test-User") }
	}
	h, err := console.New(cfg)
	require.NoError(t, err)
	return h
}

// get serves a GET and returns the status and body.
func get(t *testing.T, h http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, target, nil))
	return rec.Code, rec.Body.String()
}

// session is a browser-like client of a console behind httptest: it keeps
// cookies and reads CSRF tokens from forms.
type session struct {
	t      *testing.T
	h      http.Handler
	cookie []*http.Cookie
}

func (s *session) get(target string) (int, string) {
	s.t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(s.t.Context(), http.MethodGet, target, nil)
	for _, c := range s.cookie {
		req.AddCookie(c)
	}
	s.h.ServeHTTP(rec, req)
	if c := rec.Result().Cookies(); len(c) > 0 {
		s.cookie = c
	}
	return rec.Code, rec.Body.String()
}

func (s *session) post(target string, form url.Values, header http.Header) *httptest.ResponseRecorder {
	s.t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(s.t.Context(), http.MethodPost, target, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	if host := header.Get("Host"); host != "" {
		req.Host = host // what a reverse proxy in front would have made of it
	}
	for _, c := range s.cookie {
		req.AddCookie(c)
	}
	s.h.ServeHTTP(rec, req)
	return rec
}

var csrfInput = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

func csrfFrom(t *testing.T, body string) string {
	t.Helper()
	m := csrfInput.FindStringSubmatch(body)
	require.NotNil(t, m, "the page has no CSRF token")
	return m[1]
}
