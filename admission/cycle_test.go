package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// acquirerShare is what one acquiring process reports.
type acquirerShare struct {
	Grants      int `json:"grants"`
	Unavailable int `json:"unavailable"`
}

// acquireLoop runs workers goroutines on l until end: each acquires from
// pool (sleeping out every wait it is told), calls the provider under the
// permit and releases it with what the provider reported.
func acquireLoop(ctx context.Context, l *admission.Postgres, pool, provider string, workers int, end time.Time) (acquirerShare, error) {
	var (
		share          acquirerShare
		mu             sync.Mutex
		wg             sync.WaitGroup
		firstErr       error
		grants, unavai atomic.Int64
	)
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				p, err := l.Acquire(ctx, admission.Request{Pool: pool, Tenant: "acme", Tokens: 100 + rand.Int64N(201)})
				switch {
				case err == nil:
					grants.Add(1)
					err = callUnder(context.WithoutCancel(ctx), p, provider)
				case errors.Is(err, admission.ErrWait):
					d, _ := admission.WaitDuration(err)
					select { // sleeping out the limiter's own wait
					case <-ctx.Done():
					case <-time.After(max(d, time.Millisecond)):
					}
					err = nil
				case errors.Is(err, admission.ErrUnavailable):
					unavai.Add(1)
					err = nil
				case ctx.Err() != nil:
					err = nil
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	wg.Wait()
	share.Grants, share.Unavailable = int(grants.Load()), int(unavai.Load())
	return share, firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// callUnder makes the provider call of permit p and releases p with how it
// went: answered with the provider's usage, or uncertain.
func callUnder(ctx context.Context, p *admission.Permit, provider string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, provider, http.NoBody)
	if err != nil {
		return err
	}
	req.Header.Set("X-Max-Tokens", strconv.FormatInt(p.Tokens, 10))
	req.Header.Set("X-Granted-At", p.Acquired.Format(time.RFC3339Nano))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return errors.Join(err, p.Release(ctx, admission.CallOutcome{Result: admission.CallUncertain}))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return errors.Join(fmt.Errorf("provider: %s", resp.Status), err, p.Release(ctx, admission.CallOutcome{Result: admission.CallUncertain}))
	}
	var out struct{ Usage int64 }
	if err := json.Unmarshal(body, &out); err != nil {
		return err
	}
	return p.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: out.Usage})
}

// runAcquirers is a child process of TestFleetOfWaitersStaysWithinLimits:
// LLMQ_TEST_WORKERS acquirers until LLMQ_TEST_END, on a pool of up to 16
// connections, so the limiter's own bound is what limits its connections.
func runAcquirers(ctx context.Context, _ *pgxpool.Pool, _ *admission.Postgres) error {
	start, err := time.Parse(time.RFC3339Nano, os.Getenv("LLMQ_TEST_START"))
	if err != nil {
		return err
	}
	end, err := time.Parse(time.RFC3339Nano, os.Getenv("LLMQ_TEST_END"))
	if err != nil {
		return err
	}
	workers, err := strconv.Atoi(os.Getenv("LLMQ_TEST_WORKERS"))
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(dbtest.URL())
	if err != nil {
		return err
	}
	cfg.MaxConns = 16
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	l, err := admission.NewPostgres(db, admission.Config{Schema: os.Getenv("LLMQ_TEST_SCHEMA"), Holder: strconv.Itoa(os.Getpid()), Timeout: 15 * time.Second})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	select { // every process starts at once, so each has the same run
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(start)):
	}
	share, err := acquireLoop(ctx, l, "fleet", os.Getenv("LLMQ_TEST_PROVIDER"), workers, end)
	if err != nil {
		return err
	}
	if err := l.Flush(ctx); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(share)
}

// 200 concurrent acquirers in one process and 50 in each of 3 more share
// one pool, calling a provider that enforces its RPM, TPM (by grant time,
// in windows of 1s and 4s), in-flight and in-flight token limits (the
// last, a local server's KV budget, binds before the in-flight count
// does: 20 calls of 100 to 300 tokens would hold up to 6,000). None is
// ever exceeded,
// the limiter is not trivially safe (it grants most of the quota), every
// process is served, none is told the database is unavailable, and no
// process uses more connections at once than the limiter's budget.
//
// All four are child processes that start acquiring at the same instant:
// the test binary itself runs the package's other tests in parallel, and
// a group of acquirers sharing its runtime with them would measure that
// contention, not the limiter's fairness.
func TestFleetOfWaitersStaysWithinLimits(t *testing.T) {
	t.Parallel()
	f := setup(t, admission.Config{Timeout: 15 * time.Second})
	pool := admission.Pool{Name: "fleet", RPM: 3000, TPM: 600_000, MaxInFlight: 20, MaxInFlightTokens: 2_500, RequestBurst: 10, TokenBurst: 20_000}
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	fake := &fakeProvider{
		pool:        pool,
		windows:     []time.Duration{time.Second, 4 * time.Second},
		latency:     func() time.Duration { return 20*time.Millisecond + rand.N(80*time.Millisecond) },
		worstWindow: map[time.Duration]int{},
	}
	provider := httptest.NewServer(fake)
	t.Cleanup(provider.Close)

	run := 8 * time.Second
	start := time.Now().Add(5 * time.Second) // the children are ready within it
	end := start.Add(run)
	appName := "llmq-test-" + f.schema
	var outs []*childOut
	for i, workers := range []int{200, 50, 50, 50} {
		_, out := startChild(t, f, "acquirers", "LLMQ_TEST_PROVIDER="+provider.URL, "LLMQ_TEST_WORKERS="+strconv.Itoa(workers),
			"LLMQ_TEST_START="+start.Format(time.RFC3339Nano), "LLMQ_TEST_END="+end.Format(time.RFC3339Nano),
			fmt.Sprintf("PGAPPNAME=%s-%d", appName, i))
		line, err := out.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "ready\n", line)
		outs = append(outs, &childOut{r: out})
	}
	require.True(t, time.Now().Before(start), "the children were ready before the start")
	peak := samplePeakConnections(t, f.pool, appName, end)
	var shares []acquirerShare
	for _, o := range outs {
		var s acquirerShare
		require.NoError(t, json.NewDecoder(o.r).Decode(&s))
		shares = append(shares, s)
	}

	fake.mu.Lock()
	defer fake.mu.Unlock()
	total := 0
	for _, s := range shares {
		total += s.Grants
		require.Zero(t, s.Unavailable, "contention is never reported as unavailability")
	}
	t.Logf("grants per process %v, provider 429s %d, peak in flight %d (%d tokens), busiest windows %v, peak connections per child %d",
		shares, fake.rejected, fake.peak, fake.peakTokens, fake.worstWindow, peak())
	require.Zero(t, fake.rejected, "the provider never had to refuse a call: %v", fake.reasons)
	require.LessOrEqual(t, fake.peak, pool.MaxInFlight)
	require.LessOrEqual(t, fake.peakTokens, pool.MaxInFlightTokens)
	for _, w := range fake.windows {
		require.LessOrEqual(t, fake.worstWindow[w], int(float64(pool.RPM)/60*w.Seconds())+pool.RequestBurst, "window %v", w)
	}
	require.Greater(t, float64(total), 0.6*float64(pool.RPM)/60*run.Seconds(), "the limiter grants most of the quota")
	for i, s := range shares {
		require.Greater(t, s.Grants, total/len(shares)/4, "process %d is served", i)
	}
	require.LessOrEqual(t, peak(), admission.DefaultMaxConns, "a process's connections stay within the limiter's budget")
	inFlight, permits, err := f.pg.Counts(t.Context(), "fleet")
	require.NoError(t, err)
	require.Zero(t, inFlight, "every permit was released")
	require.Zero(t, permits)
}

type childOut struct{ r io.Reader }

// samplePeakConnections samples pg_stat_activity until end and reports the
// most connections any one process (application name appName-i) had open
// at once.
func samplePeakConnections(t *testing.T, db *pgxpool.Pool, appName string, end time.Time) func() int {
	t.Helper()
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for time.Now().Before(end) {
			var n int64
			err := db.QueryRow(context.Background(), `SELECT coalesce(max(c), 0) FROM (
				SELECT count(*) AS c FROM pg_stat_activity WHERE application_name LIKE $1 || '-%' GROUP BY application_name) AS x`,
				appName).Scan(&n)
			if err == nil && n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(20 * time.Millisecond) // a sampling period, not a wait for an event
		}
	}()
	return func() int { <-done; return int(peak.Load()) }
}

// holdPoolRow locks pool's row in a transaction of its own, as a long cycle
// of another process would, until the returned func is called.
func holdPoolRow(t *testing.T, f *fixture, pool string) (unlock func()) {
	t.Helper()
	tx, err := f.pool.Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), "SELECT 1 FROM "+f.schema+".admission_pools WHERE name = $1 FOR UPDATE", pool)
	require.NoError(t, err)
	var once sync.Once
	unlock = func() { once.Do(func() { require.NoError(t, tx.Rollback(context.Background())) }) }
	t.Cleanup(unlock)
	return unlock
}

// namedLimiter is a limiter on f's schema whose connections carry an
// application name of their own, by which the test finds them in
// pg_stat_activity (a statement's text may be longer than it shows).
func namedLimiter(t *testing.T, f *fixture, cfg admission.Config) (*admission.Postgres, string) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	appName := "llmq-test-" + f.schema
	pcfg.ConnConfig.RuntimeParams["application_name"] = appName
	db, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	cfg.Schema = f.schema
	l, err := admission.NewPostgres(db, cfg)
	require.NoError(t, err)
	return l, appName
}

// awaitLockWaiter waits until a connection named appName waits for a lock.
func awaitLockWaiter(t *testing.T, f *fixture, appName string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND application_name = $1`, appName).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond)
}

type acquired struct {
	permit *admission.Permit
	err    error
}

func goAcquire(ctx context.Context, l *admission.Postgres, req admission.Request) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := l.Acquire(ctx, req)
		ch <- acquired{p, err}
	}()
	return ch
}

// A waiter whose context ends takes nothing, whether it was still queued
// or its cycle had already taken it; the others are served.
// A closed loop of one acquirer empties the pool's queue after every
// cycle; the next cycle reuses the runner goroutine instead of starting
// one, and the runner ends once no work comes.
func TestRunnerIsReusedThenEnds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "loop", RPM: 1 << 20, TPM: 1 << 30, MaxInFlight: 10}))
	const rounds = 50
	for range rounds {
		p, err := f.pg.Acquire(t.Context(), admission.Request{Pool: "loop", Tenant: "t", Tokens: 10})
		require.NoError(t, err)
		require.NoError(t, p.Release(t.Context(), admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 5}))
	}
	require.NoError(t, f.pg.Flush(t.Context()))
	started, _ := admission.Runners(f.pg)
	// A runner ends after 10ms without work: only a stall that long (a
	// loaded machine) starts another.
	require.Less(t, started, rounds, "2 cycles a round, each would have started a runner")
	require.Eventually(t, func() bool {
		_, running := admission.Runners(f.pg)
		return running == 0
	}, 5*time.Second, 5*time.Millisecond, "a runner without work ends")
}

func TestCancelledWaiterTakesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	l, appName := namedLimiter(t, f, admission.Config{Timeout: 15 * time.Second})
	pool := slow("cancel")
	require.NoError(t, l.SetPool(t.Context(), pool))
	unlock := holdPoolRow(t, f, "cancel")

	takenCtx, cancelTaken := context.WithCancel(t.Context())
	taken := goAcquire(takenCtx, l, admission.Request{Pool: "cancel", Tokens: 100})
	awaitLockWaiter(t, f, appName) // its cycle is blocked on the row

	queuedCtx, cancelQueued := context.WithCancel(t.Context())
	queued := goAcquire(queuedCtx, l, admission.Request{Pool: "cancel", Tokens: 100})
	served := goAcquire(t.Context(), l, admission.Request{Pool: "cancel", Tokens: 100})
	require.Eventually(t, func() bool { return admission.QueuedAcquires(l, "cancel") == 2 }, 5*time.Second, time.Millisecond)

	cancelQueued()
	r := <-queued
	require.ErrorIs(t, r.err, context.Canceled)
	require.Equal(t, 1, admission.QueuedAcquires(l, "cancel"), "the cancelled waiter left the queue")
	cancelTaken()
	r = <-taken
	require.ErrorIs(t, r.err, context.Canceled, "a waiter's own deadline ends it at once, even mid-cycle")
	require.NotErrorIs(t, r.err, admission.ErrUnavailable)

	unlock()
	r = <-served
	require.NoError(t, r.err)
	require.Eventually(t, func() bool {
		inFlight, permits, err := l.Counts(t.Context(), "cancel")
		return err == nil && inFlight == 1 && permits == 1
	}, 10*time.Second, 10*time.Millisecond, "the cancelled waiter's grant was given back")
	s, err := l.State(t.Context(), "cancel")
	require.NoError(t, err)
	require.InDelta(t, 9, s.RequestLevel, 0.1, "one request unit spent: the served waiter's")
	require.InDelta(t, 900, s.TokenLevel, 1)
	require.NoError(t, r.permit.Release(t.Context(), admission.CallOutcome{Result: admission.CallNotSent}))
}

// A cycle whose transaction fails grants nothing to anyone in its group;
// the cycle before it is unaffected.
func TestFailedGroupGrantsNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	l, appName := namedLimiter(t, f, admission.Config{Timeout: 15 * time.Second})
	require.NoError(t, l.SetPool(t.Context(), slow("poisoned")))
	_, err := f.pool.Exec(t.Context(), fmt.Sprintf(`
		CREATE FUNCTION %[1]s.poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.tenant = 'poison' THEN RAISE EXCEPTION 'poisoned permit'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER poison BEFORE INSERT ON %[1]s.admission_permits FOR EACH ROW EXECUTE FUNCTION %[1]s.poison();`, f.schema))
	require.NoError(t, err)
	unlock := holdPoolRow(t, f, "poisoned")
	first := goAcquire(t.Context(), l, admission.Request{Pool: "poisoned", Tenant: "acme", Tokens: 100})
	awaitLockWaiter(t, f, appName)
	var group []<-chan acquired
	for _, tenant := range []string{"acme", "poison", "acme"} {
		group = append(group, goAcquire(t.Context(), l, admission.Request{Pool: "poisoned", Tenant: tenant, Tokens: 100}))
		n := len(group)
		require.Eventually(t, func() bool { return admission.QueuedAcquires(l, "poisoned") == n }, 5*time.Second, time.Millisecond)
	}
	unlock()

	r := <-first
	require.NoError(t, r.err)
	for _, ch := range group {
		r := <-ch
		require.ErrorContains(t, r.err, "poisoned permit")
		require.NotErrorIs(t, r.err, admission.ErrUnavailable, "a server's answer is not an outage")
		require.Nil(t, r.permit)
	}
	inFlight, permits, err := l.Counts(t.Context(), "poisoned")
	require.NoError(t, err)
	require.Equal(t, 1, inFlight, "only the first cycle's grant")
	require.Equal(t, 1, permits)
	s, err := l.State(t.Context(), "poisoned")
	require.NoError(t, err)
	require.InDelta(t, 9, s.RequestLevel, 0.1)
	require.InDelta(t, 900, s.TokenLevel, 1)
}

// pg_terminate_backend while a grouped grant is inside its transaction
// (after charging the pool, before commit): the cycle is tried again, and
// every waiter gets exactly one permit; nothing is charged twice and the
// pool's counter equals its permit rows.
func TestTerminatedCycleLosesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	l, appName := namedLimiter(t, f, admission.Config{Timeout: 15 * time.Second})
	pool := slow("terminated")
	pool.MaxInFlight, pool.RequestBurst = 20, 20
	require.NoError(t, l.SetPool(t.Context(), pool))
	// The first statement that inserts a group's permits sleeps after
	// charging the pool and inserting them (a sequence is not rolled back,
	// so only the first try sleeps).
	_, err := f.pool.Exec(t.Context(), fmt.Sprintf(`
		CREATE SEQUENCE %[1]s.naps;
		CREATE FUNCTION %[1]s.nap() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT count(*) FROM inserted) >= 2 AND nextval('%[1]s.naps') = 1 THEN PERFORM pg_sleep(60); END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER nap AFTER INSERT ON %[1]s.admission_permits REFERENCING NEW TABLE AS inserted
			FOR EACH STATEMENT EXECUTE FUNCTION %[1]s.nap();`, f.schema))
	require.NoError(t, err)

	// One acquire blocks its cycle on the row; nine queue behind it and
	// make the next cycle's group.
	unlock := holdPoolRow(t, f, "terminated")
	waiters := []<-chan acquired{goAcquire(t.Context(), l, admission.Request{Pool: "terminated", Tokens: 10})}
	awaitLockWaiter(t, f, appName)
	for range 9 {
		waiters = append(waiters, goAcquire(t.Context(), l, admission.Request{Pool: "terminated", Tokens: 10}))
	}
	require.Eventually(t, func() bool { return admission.QueuedAcquires(l, "terminated") == 9 }, 5*time.Second, time.Millisecond)
	unlock()
	var terminated bool
	require.Eventually(t, func() bool {
		err := f.pool.QueryRow(t.Context(), `SELECT coalesce(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity
			WHERE wait_event = 'PgSleep' AND application_name = $1`, appName).Scan(&terminated)
		return err == nil && terminated
	}, 10*time.Second, 5*time.Millisecond)

	seen := map[string]bool{}
	var permits []*admission.Permit
	for _, ch := range waiters {
		r := <-ch
		require.NoError(t, r.err)
		require.False(t, seen[r.permit.ID.String()])
		seen[r.permit.ID.String()] = true
		permits = append(permits, r.permit)
	}
	inFlight, rows, err := l.Counts(t.Context(), "terminated")
	require.NoError(t, err)
	require.Equal(t, 10, inFlight)
	require.Equal(t, 10, rows)
	s, err := l.State(t.Context(), "terminated")
	require.NoError(t, err)
	require.InDelta(t, 10, s.RequestLevel, 0.1, "each waiter charged once")
	for _, p := range permits {
		require.NoError(t, p.Release(t.Context(), admission.CallOutcome{Result: admission.CallAnswered, InputTokens: 10}))
	}
	inFlight, rows, err = l.Counts(t.Context(), "terminated")
	require.NoError(t, err)
	require.Zero(t, inFlight)
	require.Zero(t, rows)
}

// A pool row locked past the lock timeout is contention, answered with a
// short wait; it is never reported as an unreachable database, and the
// failure policy is not consulted.
func TestLockWaitIsContentionNotOutage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.pg.SetPool(t.Context(), slow("busy")))
	// The lock timeout is half of Timeout; the other half is the margin
	// for the server's answer on a busy machine, or the client gives up
	// first and that is an outage.
	const timeout = 3 * time.Second
	l, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema, Timeout: timeout,
		OnUnavailable: admission.FailurePolicy{Fraction: 0.5, For: time.Minute}})
	require.NoError(t, err)
	_, err = l.State(t.Context(), "busy") // the emergency allowance knows the pool
	require.NoError(t, err)
	unlock := holdPoolRow(t, f, "busy")
	start := time.Now()
	_, err = l.Acquire(t.Context(), admission.Request{Pool: "busy"})
	var wait *admission.WaitError
	require.ErrorAs(t, err, &wait)
	require.Equal(t, admission.ReasonContention, wait.Reason)
	require.NotErrorIs(t, err, admission.ErrUnavailable)
	require.Less(t, time.Since(start), timeout, "the server gave up on the lock at half the timeout")
	unlock()
	p, err := l.Acquire(t.Context(), admission.Request{Pool: "busy"})
	require.NoError(t, err)
	require.NoError(t, p.Release(t.Context(), admission.CallOutcome{}))
}

// Within a cycle, first come, first served: a request that would fit is
// not granted ahead of an earlier one that was denied, and it is told the
// earlier one's wait. A request larger than the token burst blocks nobody.
func TestCycleServesInArrivalOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	l, appName := namedLimiter(t, f, admission.Config{Timeout: 15 * time.Second})
	require.NoError(t, l.SetPool(t.Context(), slow("fifo"))) // 1,000 tokens, 0.1 a second
	unlock := holdPoolRow(t, f, "fifo")
	first := goAcquire(t.Context(), l, admission.Request{Pool: "fifo"})
	awaitLockWaiter(t, f, appName)
	var group []<-chan acquired
	for _, tokens := range []int64{5000, 600, 600, 100} {
		group = append(group, goAcquire(t.Context(), l, admission.Request{Pool: "fifo", Tokens: tokens}))
		n := len(group)
		require.Eventually(t, func() bool { return admission.QueuedAcquires(l, "fifo") == n }, 5*time.Second, time.Millisecond)
	}
	unlock()
	require.NoError(t, (<-first).err)

	tooLarge, granted, denied, behind := <-group[0], <-group[1], <-group[2], <-group[3]
	require.ErrorIs(t, tooLarge.err, admission.ErrNeverAdmissible)
	require.NoError(t, granted.err, "a request larger than the burst does not block the ones after it")
	var wait, queued *admission.WaitError
	require.ErrorAs(t, denied.err, &wait)
	require.Equal(t, admission.ReasonTokens, wait.Reason)
	require.ErrorAs(t, behind.err, &queued, "100 tokens would fit, but an earlier request waits for tokens")
	require.Equal(t, admission.ReasonTokens, queued.Reason)
	require.Equal(t, wait.RetryAfter, queued.RetryAfter)
	s, err := l.State(t.Context(), "fifo")
	require.NoError(t, err)
	require.InDelta(t, 400, s.TokenLevel, 1, "only the 600 of the granted request were taken")
	require.Equal(t, 2, s.InFlight)
}

// The second try of a cycle whose answer was lost after it committed
// reports the permits the first try granted, with their grant times, and
// charges nothing again; requests the first try denied are decided anew.
func TestRetriedCycleGrantsNothingTwice(t *testing.T) {
	t.Parallel()
	f := setup(t)
	pool := slow("again")
	pool.MaxInFlight = 2
	require.NoError(t, f.pg.SetPool(t.Context(), pool))
	reqs := []admission.Request{{Pool: "again", Tokens: 100}, {Pool: "again", Tokens: 100}, {Pool: "again", Tokens: 100}}
	first, second, err := admission.GrantTwice(t.Context(), f.pg, "again", reqs)
	require.NoError(t, err)
	require.NotNil(t, first[0])
	require.NotNil(t, first[1])
	require.Nil(t, first[2], "two slots")
	for i := range 2 {
		require.NotNil(t, second[i])
		require.Equal(t, first[i].ID, second[i].ID)
		require.True(t, first[i].Acquired.Equal(second[i].Acquired))
	}
	require.Nil(t, second[2])
	inFlight, permits, err := f.pg.Counts(t.Context(), "again")
	require.NoError(t, err)
	require.Equal(t, 2, inFlight)
	require.Equal(t, 2, permits)
	s, err := f.pg.State(t.Context(), "again")
	require.NoError(t, err)
	require.InDelta(t, 8, s.RequestLevel, 0.1, "charged once")
	require.InDelta(t, 800, s.TokenLevel, 1)
}

// A release whose cycle meets the pool row locked past the lock timeout is
// tried again, whether or not its caller still waits, so the permit's slot
// comes back once the row is free rather than when the permit expires.
func TestReleaseUnderContentionIsTriedAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		callerStay bool // the caller waits for the release; otherwise its context ends
	}{
		{name: "caller waits", callerStay: true},
		{name: "caller leaves", callerStay: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			require.NoError(t, f.pg.SetPool(t.Context(), slow("busy")))
			logs := &recordedLogs{}
			// The lock timeout is half of Timeout; the other half is the
			// margin for the server's answer on a busy machine. With less,
			// the client's deadline can pass first on every try, and the
			// release never reports contention at all.
			l, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema, Timeout: 3 * time.Second, Logger: slog.New(logs)})
			require.NoError(t, err)
			p, err := l.Acquire(t.Context(), admission.Request{Pool: "busy"})
			require.NoError(t, err)

			unlock := holdPoolRow(t, f, "busy")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			released := make(chan error, 1)
			go func() { released <- p.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered}) }()
			require.Eventually(t, func() bool {
				return slices.Contains(logs.messages(),
					"WARN admission: a release cycle waited past the lock timeout for the pool row; its releases are tried again")
			}, 10*time.Second, 5*time.Millisecond, "the release never met the locked row")
			if !tc.callerStay {
				cancel()
				require.ErrorIs(t, <-released, context.Canceled)
			}
			unlock()
			if tc.callerStay {
				require.NoError(t, <-released, "a release that met contention reports only its final outcome")
			}
			require.NoError(t, l.Flush(t.Context()))
			inFlight, permits, err := l.Counts(t.Context(), "busy")
			require.NoError(t, err)
			require.Zero(t, inFlight, "the permit's slot is held until it expires")
			require.Zero(t, permits)
			require.ErrorIs(t, p.Release(t.Context(), admission.CallOutcome{}), admission.ErrReleased)
		})
	}
}

// A pool whose slots are held only by expired permits is ready: the next
// acquire reaps them before it grants. Were it reported full, a runner
// would claim nothing for the pool, and with no acquirer nothing would
// reap its permits.
func TestReadyCountsExpiredPermitsAsFree(t *testing.T) {
	t.Parallel()
	f := setup(t)
	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "one", RPM: 6000, TPM: 1e6, MaxInFlight: 1}))
	l, err := admission.NewPostgres(f.pool, admission.Config{Schema: f.schema, PermitTTL: time.Second})
	require.NoError(t, err)
	_, err = l.Acquire(t.Context(), admission.Request{Pool: "one"}) // never released
	require.NoError(t, err)
	var wait *admission.WaitError
	require.ErrorAs(t, l.Ready(t.Context(), "one", 0), &wait)
	require.Equal(t, admission.ReasonInFlight, wait.Reason)
	require.Eventually(t, func() bool { return l.Ready(t.Context(), "one", 0) == nil }, 10*time.Second, 20*time.Millisecond,
		"a slot held by an expired permit counts as taken")
	p, err := l.Acquire(t.Context(), admission.Request{Pool: "one"})
	require.NoError(t, err, "the acquire reaps the expired permit")
	require.NoError(t, p.Release(t.Context(), admission.CallOutcome{Result: admission.CallNotSent}))
}
