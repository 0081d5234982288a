package admission

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed queries.sql
var queriesSQL string

// DBTX is what the limiter runs its statements on; pass a *pgxpool.Pool.
// Each statement commits on its own: never pass a transaction, whose row
// locks would hold the pool row until it commits. It is llmqtype.DBTX
// (Begin, Exec, Query and QueryRow), the one definition every llmq package
// shares.
type DBTX = llmqtype.DBTX

// ledgerShards is how many rows share one tenant's, pool's and day's
// usage (see migration 0005).
const ledgerShards = 8

// Defaults of a zero Config.
const (
	DefaultPermitTTL     = 2 * time.Minute
	DefaultInFlightRetry = 50 * time.Millisecond
	DefaultTimeout       = 2 * time.Second
	// DefaultMaxConns is the most statements a limiter runs at once: one
	// cycle per pool at a time plus reads such as Ready, all sharing these
	// slots (see the package documentation's connection budget).
	DefaultMaxConns = 4
)

// Config configures a Postgres limiter. The zero value uses the "llmq"
// schema and the defaults below.
type Config struct {
	// Schema holds the admission tables (see llmq.Migrate). Default "llmq".
	Schema string
	// Holder names this process on its permits, for inspection.
	Holder string
	// PermitTTL is how long a permit lives unreleased before the reaper
	// takes its slot back. It must exceed the longest call made under a
	// permit (the runner's attempt timeout); a permit that outlives it
	// still releases correctly but its slot was counted free early.
	// Default 2 minutes.
	PermitTTL time.Duration
	// InFlightRetry is the wait reported when only the in-flight limit
	// denies: a slot frees when someone releases, which no clock predicts.
	// Default 50ms.
	InFlightRetry time.Duration
	// Timeout bounds each round trip; a database that does not answer
	// within it counts as unreachable. Default 2s. Waiting for the pool
	// row's lock is bounded by half of it on the server (lock_timeout), so
	// a busy row comes back as contention (a *WaitError), not as an
	// outage. A cycle that timed out may still have been granted by the
	// server: the limiter then gives back, as never sent, every permit it
	// may have granted.
	Timeout time.Duration
	// MaxConns is the most statements the limiter runs at once, hence the
	// most connections it takes from db at the same time, whatever the
	// number of waiters. Default 4 (DefaultMaxConns). It holds none
	// between statements.
	MaxConns int
	// Logger receives the limiter's warnings and errors: the start and
	// end of a time its database cannot be reached, a cycle that waited
	// past the lock timeout, permits it could not give back. Nil means
	// slog.Default().
	Logger *slog.Logger
	// OnUnavailable is the policy while the database cannot be reached.
	// The zero value fails closed: nothing is admitted.
	OnUnavailable FailurePolicy
	// MeterProvider receives the limiter's metrics (see the package
	// documentation). Nil means none.
	MeterProvider metric.MeterProvider
}

// Postgres is the global limiter: its ceilings hold across every process
// sharing the database. It is safe for concurrent use.
type Postgres struct {
	db          DBTX
	cfg         Config
	sql         statements
	em          *emergency
	obs         *limiterInstruments
	conns       chan struct{} // a slot per statement running: Config.MaxConns
	lockTimeout string        // the cycles' lock_timeout
	qs          queues

	healthMu  sync.Mutex
	downSince time.Time // start of the current outage; zero while the database answers
}

// NewPostgres returns a limiter on db (a pool) for cfg.
func NewPostgres(db DBTX, cfg Config) (*Postgres, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	var sql statements
	if _, err := sql.load(schema); err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	cfg.Schema = schema.Name()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"PermitTTL", cfg.PermitTTL}, {"InFlightRetry", cfg.InFlightRetry}, {"Timeout", cfg.Timeout}} {
		if d.v < 0 {
			return nil, invalid(d.name, fmt.Sprintf("is %v; use 0 for the default or a positive duration", d.v))
		}
	}
	cfg.PermitTTL = cmp.Or(cfg.PermitTTL, DefaultPermitTTL)
	cfg.InFlightRetry = cmp.Or(cfg.InFlightRetry, DefaultInFlightRetry)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	if cfg.MaxConns < 0 {
		return nil, invalid("MaxConns", fmt.Sprintf("is %d; use 0 for the default or a positive count", cfg.MaxConns))
	}
	cfg.MaxConns = cmp.Or(cfg.MaxConns, DefaultMaxConns)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.PermitTTL < time.Second {
		return nil, invalid("PermitTTL", fmt.Sprintf("is %v; use at least 1s", cfg.PermitTTL))
	}
	em, err := newEmergency(cfg.OnUnavailable)
	if err != nil {
		return nil, err
	}
	obs, err := newLimiterInstruments(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("admission: instruments: %w", err)
	}
	return &Postgres{
		db: db, cfg: cfg, sql: sql, em: em, obs: obs,
		conns:       make(chan struct{}, cfg.MaxConns),
		lockTimeout: fmt.Sprintf("%dms", max(cfg.Timeout.Milliseconds()/2, 1)),
		qs:          queues{byPool: map[string]*poolQueue{}, spare: make(chan queueStart)},
	}, nil
}

// slot takes one of the limiter's statement slots; the returned func gives
// it back.
func (l *Postgres) slot(ctx context.Context) (func(), error) {
	select {
	case l.conns <- struct{}{}:
		return func() { <-l.conns }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// SetPool creates pool or changes its limits; every process sees the new
// limits on its next acquire. Current bucket levels are kept, clamped to the
// new bursts.
func (l *Postgres) SetPool(ctx context.Context, pool Pool) error {
	pool, err := pool.withDefaults()
	if err != nil {
		return err
	}
	done, err := l.slot(ctx)
	if err != nil {
		return err
	}
	defer done()
	_, err = l.db.Exec(ctx, l.sql.upsertPool, pool.Name, pool.RPM, pool.TPM, pool.MaxInFlight,
		pool.RequestBurst, pool.TokenBurst, pool.ChargeReserved, pool.RefundUncertain, pool.InputPrice, pool.OutputPrice,
		pool.MaxInFlightTokens, pool.BatchInputPrice, pool.BatchOutputPrice)
	if err != nil {
		return fmt.Errorf("admission: setting pool %q: %w", pool.Name, err)
	}
	return nil
}

// PoolState is a pool's limits and its state as of a moment.
type PoolState struct {
	Pool
	RequestLevel float64 // requests grantable now
	TokenLevel   float64 // tokens grantable now
	InFlight     int     // permits counted as held
	// InFlightTokens is the tokens those permits reserve, counted against
	// MaxInFlightTokens (kept whether or not the pool has that limit).
	InFlightTokens int64
	Cooldown       time.Duration // left of the cooldown; 0 when none
	hasExpired     bool
}

// State reads pool's limits and current levels.
func (l *Postgres) State(ctx context.Context, pool string) (PoolState, error) {
	s := PoolState{Pool: Pool{Name: pool}}
	done, err := l.slot(ctx)
	if err != nil {
		return s, err
	}
	defer done()
	p := poolScan{s: s}
	err = l.db.QueryRow(ctx, l.sql.selectPool, pool).Scan(p.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	if err != nil {
		return s, fmt.Errorf("admission: reading pool %q: %w", pool, err)
	}
	s = p.state()
	if l.em != nil {
		l.em.remember(s.Pool)
	}
	return s, nil
}

// Acquire grants req from the shared pool or reports how long to wait; see
// Limiter. While the database is unreachable the failure policy decides.
func (l *Postgres) Acquire(ctx context.Context, req Request) (*Permit, error) {
	var emergency bool
	p, err := l.acquire(ctx, req, &emergency)
	l.obs.acquired(ctx, req, err, emergency)
	return p, dbsql.Explain(err, l.cfg.Schema, "admission.Config.Schema")
}

// acquire is Acquire; emergency is set when the permit came from the
// emergency allowance.
func (l *Postgres) acquire(ctx context.Context, req Request, emergency *bool) (*Permit, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Its caller gave up: no cycle, and no outage to report.
		return nil, err
	}
	if l.em != nil && !l.em.knows(req.Pool) {
		// The emergency allowance needs the pool's limits before an
		// outage, not during one.
		if err := l.bounded(ctx, func(ctx context.Context) error {
			_, err := l.State(ctx, req.Pool)
			return err
		}); err != nil {
			return l.fallback(ctx, req, err, emergency)
		}
	}
	w := &acquireWaiter{req: req, id: uuid.Must(uuid.NewV7()), verdict: make(chan acquireVerdict, 1)}
	l.enqueue(ctx, req.Pool, w, nil)
	p, err := l.waitAcquire(ctx, req.Pool, w)
	if err != nil {
		return l.fallback(ctx, req, err, emergency)
	}
	return p, nil
}

// bounded runs fn with the statement timeout: a database that does not
// answer within it counts as unreachable.
func (l *Postgres) bounded(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	return fn(ctx)
}

// fallback applies the failure policy to an acquire that failed with err:
// errors that mean the database is unreachable become ErrUnavailable or an
// emergency grant; every other error is returned as it is.
func (l *Postgres) fallback(ctx context.Context, req Request, err error, emergency *bool) (*Permit, error) {
	if !unreachable(ctx, err) {
		return nil, err
	}
	if l.em == nil {
		return nil, fmt.Errorf("%w (failing closed): %w", ErrUnavailable, err)
	}
	p, err := l.em.acquire(ctx, req, err)
	*emergency = err == nil
	return p, err
}

// unreachable reports whether err means the database could not be asked,
// as opposed to an answer (a denial, an unknown pool, a constraint) or the
// caller's own cancellation.
func unreachable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	for _, answered := range []error{ErrWait, ErrNeverAdmissible, ErrUnknownPool, ErrInvalid} {
		if errors.Is(err, answered) {
			return false
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// The server answered; only its connection, shutdown and resource
		// classes mean it cannot serve the limiter now.
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P") ||
			strings.HasPrefix(pgErr.Code, "53")
	}
	return true
}

// errReapable marks an in-flight denial while expired permits exist: the
// next cycle reaps them before it grants.
var errReapable = errors.New("admission: expired permits to reap")

// Ready reports whether pool could grant a request of tokens now, from its
// state, taking nothing: nil if it could, else the *WaitError an Acquire
// would return (or ErrUnknownPool, a *NeverAdmissibleError, ...). Runners
// ask before they claim work for the pool.
func (l *Postgres) Ready(ctx context.Context, pool string, tokens int64) error {
	s, err := l.State(ctx, pool)
	if err != nil {
		return err
	}
	return s.ready(Request{Pool: pool, Tokens: tokens}, l.cfg.InFlightRetry)
}

func (s PoolState) ready(req Request, inFlightRetry time.Duration) error {
	err := s.denial(req, inFlightRetry)
	var w *WaitError
	if errors.Is(err, errReapable) || (errors.As(err, &w) && w.Reason == ReasonContention) {
		return nil // nothing stands in the way now (the next acquire reaps expired permits)
	}
	return err
}

// denial explains why s cannot grant req now; a *WaitError with no wait
// when it could.
func (s PoolState) denial(req Request, inFlightRetry time.Duration) error {
	if err := neverAdmissible(s.Pool, req); err != nil {
		return err
	}
	w := &WaitError{Pool: s.Name}
	consider := func(r Reason, d time.Duration) {
		if d > w.RetryAfter || w.Reason == "" {
			w.Reason, w.RetryAfter = r, d
		}
	}
	if s.Cooldown > 0 {
		consider(ReasonCooldown, s.Cooldown)
	}
	if s.RequestLevel < 1 {
		consider(ReasonRequests, seconds((1-s.RequestLevel)*60/float64(s.RPM)))
	}
	if s.TokenLevel < float64(req.Tokens) {
		consider(ReasonTokens, seconds((float64(req.Tokens)-s.TokenLevel)*60/float64(s.TPM)))
	}
	if s.InFlight >= s.MaxInFlight {
		if s.hasExpired {
			return errReapable
		}
		consider(ReasonInFlight, inFlightRetry)
	}
	if s.MaxInFlightTokens > 0 && s.InFlightTokens+req.Tokens > s.MaxInFlightTokens {
		if s.hasExpired {
			return errReapable
		}
		consider(ReasonInFlightTokens, inFlightRetry)
	}
	if w.Reason == "" {
		// Free now: the state moved between the denied UPDATE and this
		// read (a release, a refill).
		consider(ReasonContention, contentionRetry)
	}
	return w
}

// release settles p in its pool's next cycle, together with the other
// releases and grants queued for that pool in this process.
func (l *Postgres) release(ctx context.Context, p *Permit, o CallOutcome) error {
	w := &releaseWaiter{permit: p, outcome: o, done: make(chan error, 1)}
	l.enqueue(ctx, p.Pool, nil, w)
	if err := l.waitRelease(ctx, p.Pool, w); err != nil {
		return fmt.Errorf("admission: releasing permit %s of pool %q: %w", p.ID, p.Pool, err)
	}
	l.obs.released(ctx, p, o)
	// A permit that had expired and was reaped deletes nothing: its slot
	// is already back and it was charged in full, as an uncertain call is.
	return nil
}

// Reap returns the in-flight slots of pool's expired permits and reports
// how many it freed. Every grant cycle reaps first, so a pool with
// acquirers needs no other reaper; call Reap to free slots of an idle
// pool sooner.
func (l *Postgres) Reap(ctx context.Context, pool string) (int, error) {
	done, err := l.slot(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	var n int
	err = l.db.QueryRow(ctx, l.sql.reapPermits, pool).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("admission: reaping pool %q: %w", pool, err)
	}
	return n, nil
}

// Cooldown stops every holder of pool from acquiring for d (a provider's
// Retry-After). A cooldown only extends: a shorter one leaves a longer one
// in place.
func (l *Postgres) Cooldown(ctx context.Context, pool string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if err := (Request{Pool: pool}).Validate(); err != nil {
		return err
	}
	done, err := l.slot(ctx)
	if err != nil {
		return err
	}
	defer done()
	if _, err := l.db.Exec(ctx, l.sql.setCooldown, pool, d); err != nil {
		return fmt.Errorf("admission: cooling down pool %q: %w", pool, err)
	}
	l.obs.cooled(ctx, pool)
	if l.em != nil {
		l.em.cooldown(pool, d)
	}
	return nil
}

// LowerRemaining lowers pool's buckets to what the provider reported left;
// it never raises them.
func (l *Postgres) LowerRemaining(ctx context.Context, pool string, r Remaining) error {
	if r.Requests == nil && r.Tokens == nil {
		return nil
	}
	if err := (Request{Pool: pool}).Validate(); err != nil {
		return err
	}
	done, err := l.slot(ctx)
	if err != nil {
		return err
	}
	defer done()
	if _, err := l.db.Exec(ctx, l.sql.lowerRemaining, pool, toFloat(r.Requests), toFloat(r.Tokens)); err != nil {
		return fmt.Errorf("admission: lowering pool %q: %w", pool, err)
	}
	return nil
}

// Counts reports pool's in-flight counter and its live permit rows.
func (l *Postgres) Counts(ctx context.Context, pool string) (inFlight, permits int, err error) {
	done, err := l.slot(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	err = l.db.QueryRow(ctx, l.sql.countPermits, pool).Scan(&inFlight, &permits)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, fmt.Errorf("%w: %q", ErrUnknownPool, pool)
	}
	return inFlight, permits, err
}

func toFloat(v *int64) *float64 {
	if v == nil {
		return nil
	}
	f := float64(*v)
	return &f
}

// seconds converts a float count of seconds to a duration, rounding up so
// a wait never ends before the budget is back, and saturating.
func seconds(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	if s >= math.MaxInt64/float64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Ceil(s * float64(time.Second)))
}

// Usage is one row of the usage ledger: what the provider reported for a
// tenant's calls to a pool on one UTC day.
type Usage struct {
	Tenant            string    `json:"tenant"`
	Pool              string    `json:"pool"`
	Day               time.Time `json:"day"`
	Attempts          int64     `json:"attempts"`           // calls sent
	UncertainAttempts int64     `json:"uncertain_attempts"` // sent, not answered: possibly billed
	InputTokens       int64     `json:"input_tokens"`
	OutputTokens      int64     `json:"output_tokens"`
	Cost              int64     `json:"cost"` // micro-units, at the pool's prices when each call was released
	// BatchAttempts is how many of Attempts were provider batch requests,
	// and BatchCost how much of Cost they were, at the pool's batch prices
	// (BatchLedger).
	BatchAttempts int64 `json:"batch_attempts"`
	BatchCost     int64 `json:"batch_cost"`
}

// Usage returns tenant's ledger rows for the UTC days from through to.
// The ledger is written by Release from reported usage; permits that
// expired unreleased (their holder died) are not in it.
func (l *Postgres) Usage(ctx context.Context, tenant string, from, to time.Time) ([]Usage, error) {
	done, err := l.slot(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	rows, err := l.db.Query(ctx, l.sql.selectUsage, tenant, dateArg(from), dateArg(to))
	if err != nil {
		return nil, fmt.Errorf("admission: reading usage of tenant %q: %w", tenant, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Usage, error) {
		var u Usage
		err := row.Scan(usageDest(&u)...)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("admission: reading usage of tenant %q: %w", tenant, err)
	}
	return out, nil
}

// utcDay is t's UTC calendar day, as a date parameter.
func utcDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// dateArg is t's UTC calendar day as a date argument: a pgtype.Date is the
// same text ("2006-01-02") whether or not pgx knows the parameter's type,
// where a time.Time would be a timestamp without it.
func dateArg(t time.Time) pgtype.Date { return pgtype.Date{Time: utcDay(t), Valid: true} }
