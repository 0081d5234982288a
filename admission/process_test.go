package admission_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// The test binary re-executes itself as limiter processes for tests that
// must prove a limit across real processes, or kill one.
const childEnv = "LLMQ_ADMISSION_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "pool-runner":
		os.Exit(child(runPoolRunner))
	case "holder":
		os.Exit(child(runHolder))
	case "runner":
		os.Exit(child(runRunner))
	case "acquirers":
		os.Exit(child(runAcquirers))
	case "default-logger":
		os.Exit(runDefaultLogger())
	}
	// Cycle goroutines end when their queues empty; none may outlive the
	// tests.
	goleak.VerifyTestMain(m)
}

func child(run func(ctx context.Context, db *pgxpool.Pool, l *admission.Postgres) error) int {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dbtest.URL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	ttl, _ := time.ParseDuration(os.Getenv("LLMQ_TEST_TTL"))
	l, err := admission.NewPostgres(db, admission.Config{
		Schema: os.Getenv("LLMQ_TEST_SCHEMA"), Holder: strconv.Itoa(os.Getpid()),
		PermitTTL: ttl, InFlightRetry: 100 * time.Millisecond,
		// The whole suite shares two cores with Postgres: a statement may
		// take seconds, which is not the outage these tests are about.
		Timeout: 15 * time.Second,
	})
	if err == nil {
		err = run(ctx, db, l)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runHolder takes one permit, says so, and holds it until killed.
func runHolder(ctx context.Context, _ *pgxpool.Pool, l *admission.Postgres) error {
	if _, err := l.Acquire(ctx, admission.Request{Pool: "held", Tenant: "acme"}); err != nil {
		return err
	}
	fmt.Println("held")
	<-ctx.Done() // never: killed here
	return nil
}

// runPoolRunner is one of the eight runner processes: a lease.Runner with
// five workers whose "extract" handler calls the provider under an
// admission permit, until LLMQ_TEST_END; it then shuts down gracefully and
// reports how many attempts its handler made.
func runPoolRunner(ctx context.Context, db *pgxpool.Pool, l *admission.Postgres) error {
	end, err := time.Parse(time.RFC3339Nano, os.Getenv("LLMQ_TEST_END"))
	if err != nil {
		return err
	}
	store, err := jobs.NewStore(jobs.Config{Schema: os.Getenv("LLMQ_TEST_SCHEMA")})
	if err != nil {
		return err
	}
	provider := os.Getenv("LLMQ_TEST_PROVIDER")
	var calls atomic.Int64
	cfg := runnerConfig(l, "shared", provider, os.Getenv("LLMQ_TEST_WORKER"))
	cfg.Handlers = map[string]lease.Handler{"extract": lease.HandlerFunc(func(ctx context.Context, _ *jobs.Job) (json.RawMessage, error) {
		calls.Add(1)
		return grantedCall(ctx, provider)
	})}
	cfg.Admission.Route = func(job *jobs.Job) (admission.Request, bool) {
		return admission.Request{Pool: "shared", Tenant: job.Tenant, Tokens: job.EstimatedTokens}, true
	}
	cfg.Queues = map[string]lease.QueueConfig{jobs.DefaultQueue: {MaxWorkers: 5}}
	// Calls take up to 1.5s; on a loaded machine a 2s attempt timeout
	// would cancel some, and a cancelled call's slot is given back while
	// the provider may still be working on it: a real overshoot of any
	// client-side limiter, but not what this test measures.
	cfg.LeaseDuration, cfg.HeartbeatInterval, cfg.AttemptTimeout = 30*time.Second, time.Second, 10*time.Second
	r, err := lease.NewRunner(db, store, cfg)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	if err := r.Run(runCtx); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(calls.Load())
}

// grantedCall is the handler's model call: it asks for the permit's tokens
// as max_tokens and tells the provider when the permit was granted.
func grantedCall(ctx context.Context, url string) (json.RawMessage, error) {
	permit := lease.PermitOf(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, http.NoBody)
	if err != nil {
		return nil, lease.NotSent(err)
	}
	req.Header.Set("X-Max-Tokens", strconv.FormatInt(permit.Tokens, 10))
	req.Header.Set("X-Granted-At", permit.Acquired.Format(time.RFC3339Nano))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	lease.Responded(ctx, resp.StatusCode, resp.Header)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("provider: %s", resp.Status)
	}
	var out struct{ Usage int64 }
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, jobs.InvalidOutput(err, body)
	}
	lease.RecordUsage(ctx, jobs.Usage{InputTokens: out.Usage})
	return body, nil
}

// fakeProvider enforces a pool's limits: in-flight calls on arrival, and
// requests and tokens in every window of the given lengths (at most
// rate·window + burst, closed windows), by each call's grant time, which
// the caller sends in X-Granted-At. It answers a violation with 429 and
// counts it; it charges 60% of max_tokens.
//
// Windows are counted on grant times, not arrival times, because a call
// reaches the provider a variable delay after its grant (scheduling and
// the network, tens of milliseconds on a loaded machine): two calls
// granted a request interval apart can arrive together, which no
// client-side limiter can prevent and real providers tolerate. The grant
// times are what the limiter controls, and by them the limit is exact.
type fakeProvider struct {
	pool    admission.Pool
	windows []time.Duration
	latency func() time.Duration

	mu          sync.Mutex
	grants      []arrival // sorted by time
	inFlight    int
	peak        int
	tokensHeld  int64 // reserved by the calls in flight, against pool.MaxInFlightTokens
	peakTokens  int64
	rejected    int
	reasons     []string
	worstWindow map[time.Duration]int // most requests seen in a window of each length
}

type arrival struct {
	at     time.Time
	tokens int64
}

func (p *fakeProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	maxTokens, _ := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
	granted, err := time.Parse(time.RFC3339Nano, r.Header.Get("X-Granted-At"))
	if err != nil {
		http.Error(w, "no grant time", http.StatusBadRequest)
		return
	}
	used := maxTokens * 6 / 10
	if !p.admit(arrival{granted, used}, maxTokens) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	time.Sleep(p.latency()) // the model thinking
	p.mu.Lock()
	p.inFlight--
	p.tokensHeld -= maxTokens
	p.mu.Unlock()
	_, _ = fmt.Fprintf(w, `{"usage": %d}`, used)
}

func (p *fakeProvider) admit(g arrival, reserved int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight+1 > p.pool.MaxInFlight {
		p.rejected++
		p.reasons = append(p.reasons, "in flight")
		return false
	}
	if p.pool.MaxInFlightTokens > 0 && p.tokensHeld+reserved > p.pool.MaxInFlightTokens {
		p.rejected++
		p.reasons = append(p.reasons, fmt.Sprintf("in-flight tokens: %d held, %d more", p.tokensHeld, reserved))
		return false
	}
	i := sort.Search(len(p.grants), func(i int) bool { return p.grants[i].at.After(g.at) })
	grants := slices.Insert(slices.Clone(p.grants), i, g)
	for _, w := range p.windows {
		maxN := int(float64(p.pool.RPM)/60*w.Seconds()) + p.pool.RequestBurst
		maxTokens := int64(float64(p.pool.TPM)/60*w.Seconds()) + p.pool.TokenBurst
		// Every closed window [start, start+w] holding the new grant
		// starts at some grant in [g-w, g].
		for s := i; s >= 0 && g.at.Sub(grants[s].at) <= w; s-- {
			n, sum := 0, int64(0)
			for e := s; e < len(grants) && grants[e].at.Sub(grants[s].at) <= w; e++ {
				n++
				sum += grants[e].tokens
			}
			if n > maxN || sum > maxTokens {
				p.rejected++
				p.reasons = append(p.reasons, fmt.Sprintf("window %v: %d requests, %d tokens", w, n, sum))
				return false
			}
			p.worstWindow[w] = max(p.worstWindow[w], n)
		}
	}
	p.grants = grants
	p.inFlight++
	p.peak = max(p.peak, p.inFlight)
	p.tokensHeld += reserved
	p.peakTokens = max(p.peakTokens, p.tokensHeld)
	return true
}

// startChild re-executes the test binary as one limiter process.
func startChild(t *testing.T, f *fixture, role string, env ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env,
		childEnv+"="+role, "LLMQ_TEST_SCHEMA="+f.schema, "DATABASE_URL="+dbtest.URL())...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(stdout)
}

// Eight runner processes (five workers each) share one pool of RPM 600,
// TPM 120,000 and 20 in flight, against a provider that enforces exactly
// those limits, with a backlog larger than the quota lets through.
//
// Time is compressed by speedup so the test ends in about half a minute:
// the pool's rates are speedup times the real ones and the provider checks
// windows speedup times shorter (1s, 10s and 60s become 0.5s, 5s and
// 30s), with the same bursts and in-flight limit. Counts per window are
// invariant under that scaling (rate·window is the same), so this is the
// real experiment played faster.
func TestEightProcessesStayWithinProviderLimits(t *testing.T) {
	t.Parallel()
	const speedup = 2
	f := setupRunner(t)
	pool := admission.Pool{
		Name: "shared", RPM: 600 * speedup, TPM: 120_000 * speedup, MaxInFlight: 20,
		RequestBurst: 10, TokenBurst: 12_000,
	}
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	fake := &fakeProvider{
		pool:        pool,
		windows:     []time.Duration{time.Second / speedup, 10 * time.Second / speedup, 60 * time.Second / speedup},
		latency:     func() time.Duration { return 300*time.Millisecond + rand.N(1200*time.Millisecond) },
		worstWindow: map[time.Duration]int{},
	}
	provider := httptest.NewServer(fake)
	t.Cleanup(provider.Close)

	// More work than the quota lets through in the run: reservations of
	// 100 to 300 tokens, so requests and tokens bind about equally.
	run := 60 * time.Second / speedup
	for range 3 {
		batch := make([]jobs.EnqueueParams, 500)
		for i := range batch {
			batch[i] = jobs.EnqueueParams{Tenant: "acme", Kind: "extract", EstimatedTokens: 100 + rand.Int64N(201)}
		}
		_, err := f.store.EnqueueMany(t.Context(), f.pool, batch)
		require.NoError(t, err)
	}

	end := time.Now().Add(run + 2*time.Second) // the processes start within 2s
	var readers []*bufio.Reader
	for i := range 8 {
		_, out := startChild(t, f.fixture, "pool-runner", "LLMQ_TEST_PROVIDER="+provider.URL,
			"LLMQ_TEST_END="+end.Format(time.RFC3339Nano), fmt.Sprintf("LLMQ_TEST_WORKER=runner-%d", i))
		readers = append(readers, out)
	}
	calls := int64(0)
	for _, r := range readers {
		var n int64
		require.NoError(t, json.NewDecoder(r).Decode(&n))
		calls += n
	}

	fake.mu.Lock()
	defer fake.mu.Unlock()
	t.Logf("calls %d, provider 429s %d, peak in flight %d, busiest windows %v", calls, fake.rejected, fake.peak, fake.worstWindow)
	require.Zero(t, fake.rejected, "the provider never had to refuse a call: %v", fake.reasons)
	require.LessOrEqual(t, fake.peak, 20)
	for _, w := range fake.windows {
		require.LessOrEqual(t, fake.worstWindow[w], int(float64(pool.RPM)/60*w.Seconds())+pool.RequestBurst, "window %v", w)
	}
	// The limiter is not trivially safe: it used most of the quota.
	require.Greater(t, float64(calls), 0.6*float64(pool.RPM)/60*run.Seconds())
	inFlight, permits, err := f.pg.Counts(t.Context(), "shared")
	require.NoError(t, err)
	require.Zero(t, inFlight, "every permit was released")
	require.Zero(t, permits)
}

// A process killed (SIGKILL) while holding a permit: the slot returns once
// the permit expires, and the pool's counter equals the live permits.
func TestKilledHolderPermitExpires(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "held", RPM: 600, TPM: 1e6, MaxInFlight: 2}))
	doomed, doomedOut := startChild(t, f, "holder", "LLMQ_TEST_TTL=1s")
	_, aliveOut := startChild(t, f, "holder", "LLMQ_TEST_TTL=1m")
	for _, out := range []*bufio.Reader{doomedOut, aliveOut} {
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "held\n", line)
	}
	require.NoError(t, doomed.Process.Kill())
	_ = doomed.Wait()

	_, err := f.pg.Acquire(t.Context(), admission.Request{Pool: "held"})
	var wait *admission.WaitError
	require.ErrorAs(t, err, &wait, "both slots are held until the dead holder's permit expires")
	require.Equal(t, admission.ReasonInFlight, wait.Reason)

	var permit *admission.Permit
	require.Eventually(t, func() bool {
		permit, err = f.pg.Acquire(t.Context(), admission.Request{Pool: "held"})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
	inFlight, permits, err := f.pg.Counts(t.Context(), "held")
	require.NoError(t, err)
	require.Equal(t, 2, inFlight, "the live holder's and ours")
	require.Equal(t, permits, inFlight)
	require.NoError(t, permit.Release(t.Context(), admission.CallOutcome{Result: admission.CallAnswered}))
	inFlight, permits, err = f.pg.Counts(t.Context(), "held")
	require.NoError(t, err)
	require.Equal(t, 1, inFlight)
	require.Equal(t, permits, inFlight)
}
