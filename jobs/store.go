package jobs

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed queries.sql
var queriesSQL string

// DBTX is the caller's transaction or connection: *pgxpool.Pool, *pgx.Conn
// and pgx.Tx all satisfy it. Pass a transaction to make a store call part of
// the caller's own unit of work; pass a pool to run it on its own. It is
// llmqtype.DBTX (Begin, Exec, Query and QueryRow), the one definition every
// llmq package shares.
type DBTX = llmqtype.DBTX

// Store is what a host service calls: accept jobs, read them, cancel and
// replay them. Every method runs on the DBTX it is given and never opens
// connections of its own. PostgresStore implements it, and RunnerStore, the
// runner's side, which a host does not call.
type Store interface {
	// Enqueue accepts one job and writes its "<kind>.requested" outbox event
	// in the same statement. See EnqueueParams for idempotency.
	Enqueue(ctx context.Context, db DBTX, params EnqueueParams) (EnqueueResult, error)
	// EnqueueMany accepts a batch atomically: every job is accepted (or
	// found under its idempotency key), or nothing is written. Results are
	// in input order.
	EnqueueMany(ctx context.Context, db DBTX, params []EnqueueParams) ([]EnqueueResult, error)
	// Get returns the tenant's job, or ErrNotFound.
	Get(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Job, error)
	// List returns a page of the tenant's jobs, newest first.
	List(ctx context.Context, db DBTX, params ListParams) (*ListResult, error)
	// Cancel cancels a waiting job, or asks its runner to cancel a running
	// one. It returns the job as it now is.
	Cancel(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Job, error)
	// Stats summarises every queue that has unfinished jobs or jobs
	// finished within StatsWindow, at a cost that does not grow with
	// history.
	Stats(ctx context.Context, db DBTX) ([]QueueStats, error)
	// Attempts returns the tenant's job's attempts, oldest first.
	Attempts(ctx context.Context, db DBTX, tenant string, id uuid.UUID) ([]Attempt, error)
	// Steps returns the tenant's job's stored durable steps (lease.Step),
	// in the order they were stored.
	Steps(ctx context.Context, db DBTX, tenant string, id uuid.UUID) ([]Step, error)
	// EnqueueBatch accepts jobs as one batch, idempotent per batch key;
	// Batch reads its progress in constant time; CancelBatch cancels what
	// of it has not finished.
	EnqueueBatch(ctx context.Context, db DBTX, params EnqueueBatchParams) (EnqueueBatchResult, error)
	Batch(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Batch, error)
	CancelBatch(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (BatchCancelResult, error)
	// Replay creates a new job from a finished one, leaving it unchanged.
	// A second replay of the same job returns the first one's job unless
	// params.Again asks for another.
	Replay(ctx context.Context, db DBTX, params ReplayParams) (ReplayResult, error)
}

// RunnerStore is the runner's side of the job store: claims, heartbeats and
// fenced completions, and the reaper that takes back expired leases.
// lease.NewRunner takes it; a host passes its PostgresStore and never calls
// these methods itself. Like Store, every method runs on the DBTX it is
// given.
type RunnerStore interface {
	// Claim leases up to params.Limit eligible jobs of one queue, shared
	// fairly among its tenants.
	Claim(ctx context.Context, db DBTX, params ClaimParams) ([]*Job, error)
	// WakeIdleTenants makes tenants of queue that a claim found without
	// runnable work active again once they have some (a retry's time came);
	// idleFor > 0 looks only at those idle for less than that.
	WakeIdleTenants(ctx context.Context, db DBTX, queue string, idleFor time.Duration) (int64, error)
	// Leases returns the RUNNING jobs of queue leased to worker: after a
	// claim whose reply was lost, the leases it took that the worker never
	// heard of.
	Leases(ctx context.Context, db DBTX, worker, queue string) ([]*Job, error)
	// Heartbeat extends the leases worker still holds.
	Heartbeat(ctx context.Context, db DBTX, worker string, leaseDuration time.Duration, leases []Lease) (HeartbeatResult, error)
	// Complete applies attempt outcomes, each only under its fence.
	Complete(ctx context.Context, db DBTX, completions []Completion) ([]CompletionResult, error)
	// Move ends a held job's lease and puts it in another queue (a
	// provider batch submitter's hand-over to synchronous runners).
	Move(ctx context.Context, db DBTX, params MoveParams) (*Job, error)
	// MarkHung gives up attempts whose handlers ignore their cancellation:
	// their fences move on and their rows say "hung"; their leases are left
	// to expire for the reaper.
	MarkHung(ctx context.Context, db DBTX, worker string, hung []HungAttempt) ([]Lease, error)
	// Reap takes back expired leases and fails jobs past their deadline.
	Reap(ctx context.Context, db DBTX, params ReapParams) (ReapResult, error)
	// Attempts is Store.Attempts: the runner reads a job's history to count
	// the attempts that ended in invalid output.
	Attempts(ctx context.Context, db DBTX, tenant string, id uuid.UUID) ([]Attempt, error)
	// Get is Store.Get: a provider batch submitter reads a succeeded job
	// back for the host's OnSucceeded hook, which Complete's result alone
	// cannot give it.
	Get(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Job, error)
	// TakeStep and SaveStep read and store a durable step's output
	// (lease.Step), each only under the attempt's fence.
	TakeStep(ctx context.Context, db DBTX, params StepParams) (step Step, found bool, err error)
	SaveStep(ctx context.Context, db DBTX, params SaveStepParams) (Step, error)
	// Channel is the NOTIFY channel Enqueue signals on.
	Channel() string
}

// Limits on job parameters.
const (
	MaxTenantLen           = 200
	MaxKindLen             = 100
	MaxQueueLen            = 100
	MaxIdempotencyKeyLen   = 255
	MaxRequestHashLen      = 128
	MaxGroupKeyLen         = 255
	MaxPriority            = 9
	MaxMaxAttempts         = 1000
	MaxBatch               = 10_000
	MaxListLimit           = 1000
	DefaultQueue           = "default"
	DefaultMaxPayloadBytes = 64 << 10
	DefaultMaxAttempts     = 5
	DefaultEventTopic      = "llmq.jobs"
	defaultListLimit       = 100
)

// DefaultClaimIdleTimeout is Config.ClaimIdleTimeout's default.
const DefaultClaimIdleTimeout = 5 * time.Second

// DefaultNotifyInterval is Config.NotifyInterval's default: shorter than
// the runner's short claim loop after a wake-up (20ms), so a job whose
// enqueue sent no NOTIFY still starts within it.
const DefaultNotifyInterval = 5 * time.Millisecond

// Config configures a PostgresStore. The zero value accepts jobs into the
// "default" queue of the "llmq" schema with the documented limits.
type Config struct {
	// Schema holds the llmq tables (see llmq.Migrate). Default "llmq".
	Schema string
	// Queues are the queue names Enqueue accepts; any other is
	// ErrUnknownQueue. Default: just "default".
	Queues []string
	// MaxPayloadBytes bounds EnqueueParams.Payload. Default 64 KiB: a
	// payload carries ids and options, not documents.
	MaxPayloadBytes int
	// DefaultMaxAttempts applies when EnqueueParams.MaxAttempts is zero.
	// Default 5.
	DefaultMaxAttempts int
	// EventTopic is the outbox topic of job lifecycle events. Default
	// "llmq.jobs".
	EventTopic string
	// NotifyInterval limits Enqueue's NOTIFYs to one per queue per interval
	// from this store. Zero means DefaultNotifyInterval (5ms); a negative
	// interval notifies on every enqueue.
	//
	// Postgres serialises the commits of notifying transactions (each holds
	// a database-wide lock until its commit record is flushed), so at high
	// acceptance rates the NOTIFY, not the insert, sets the pace: see
	// docs/performance.md for measured figures. With an interval, an
	// enqueue that sends no NOTIFY follows, within the interval, one from
	// the same store that did; runners keep claiming for a while after
	// each wake-up and poll as a fallback, so such a job waits at most a
	// poll interval, and usually much less. A NOTIFY lost with a rolled-back transaction is covered the
	// same way. Measured with llmq bench (16 producers, one job per
	// transaction): 1,700 jobs/s notifying on every enqueue, 3,000 with
	// 5ms, and no change to pickup latency at 100 or 400 arrivals per
	// second (p99 4–12 ms either way).
	NotifyInterval time.Duration
	// ClaimIdleTimeout bounds how long a claim's transaction may sit idle
	// between its two round trips (Postgres' idle_in_transaction_session_
	// timeout, for that transaction only). The claim holds its tenants' row
	// locks there; a claimer that stalls at that point (a paused process, a
	// frozen VM) would otherwise keep every other runner from those
	// tenants' work until it woke. Past the timeout Postgres ends its
	// session and the locks are free. Default 5s; a claim never idles more
	// than a round trip when healthy.
	ClaimIdleTimeout time.Duration
	// DisableNotify stops Enqueue from sending NOTIFYs at all, for hosts
	// whose runners poll or are woken by a broker.
	DisableNotify bool
	// KindsWithoutEvents are job kinds whose jobs write no lifecycle events
	// (requested, retry_scheduled, completed, review_required,
	// dead_lettered, cancelled) to the outbox: for hosts that run no relay,
	// or kinds nobody watches, so that no event rows pile up unpublished
	// (which llmq stats would rightly report as relay lag). Default: none,
	// every kind writes its events.
	//
	// It is decided once per job, when this store accepts it (Enqueue,
	// EnqueueMany, Kind.Enqueue), and recorded on the job row; a replay
	// writes events only if its source job did and this store does not
	// name the kind (operator tools build stores without the host's
	// setting, and must not turn events back on): every later transition of that job honours it, whichever
	// process's store makes the transition (a runner, a reaper, an
	// operator's cancel), so a job's events are all written or none are.
	// Changing the setting affects jobs accepted afterwards; jobs accepted
	// before keep theirs. Nothing else changes: state, attempts, results,
	// fences and idempotency work the same, and job state stays readable
	// with Get, List and the attempts history.
	KindsWithoutEvents []string
	// OnAccept, when set, runs inside every Enqueue and EnqueueMany
	// transaction after the jobs are inserted, with the jobs that call
	// created (not those found by idempotency key). An error rolls the
	// whole call back (a savepoint inside the caller's transaction) and is
	// returned wrapped: admission.Quotas refuses over-quota work this way.
	// With a hook, Enqueue is a transaction rather than one statement.
	OnAccept AcceptHook
}

// AcceptHook checks or extends an acceptance inside its transaction; see
// Config.OnAccept. accepted is never empty.
type AcceptHook func(ctx context.Context, tx pgx.Tx, accepted []*Job) error

// PostgresStore is the Store on PostgreSQL. It holds no connections and is
// safe for concurrent use.
type PostgresStore struct {
	cfg     Config
	queues  map[string]bool
	channel string
	notify  *notifyLimiter
	sql     statements

	// claimLockTimeout is how long a lock-free claim waits for a job's
	// row; until skipLockedUntil (Unix ns), claims skip locked rows
	// instead (see Claim).
	claimLockTimeout time.Duration
	skipLockedUntil  atomic.Int64
}

var (
	_ Store       = (*PostgresStore)(nil)
	_ RunnerStore = (*PostgresStore)(nil)
)

// NewStore validates cfg once and prepares the store's SQL for its schema.
func NewStore(cfg Config) (*PostgresStore, error) {
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	var sql statements
	if _, err := sql.load(schema); err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	cfg.Schema = schema.Name()
	if len(cfg.Queues) == 0 {
		cfg.Queues = []string{DefaultQueue}
	}
	queues := make(map[string]bool, len(cfg.Queues))
	for _, q := range cfg.Queues {
		if !validName(q, MaxQueueLen) {
			return nil, fmt.Errorf("jobs: queue name %q: use letters, digits, '.', '_' and '-', at most %d bytes", q, MaxQueueLen)
		}
		queues[q] = true
	}
	switch {
	case cfg.MaxPayloadBytes < 0:
		return nil, fmt.Errorf("jobs: MaxPayloadBytes is %d; use 0 for the default or a positive limit", cfg.MaxPayloadBytes)
	case cfg.DefaultMaxAttempts < 0 || cfg.DefaultMaxAttempts > MaxMaxAttempts:
		return nil, fmt.Errorf("jobs: DefaultMaxAttempts is %d; use 0 for the default or 1 to %d", cfg.DefaultMaxAttempts, MaxMaxAttempts)
	}
	cfg.MaxPayloadBytes = cmp.Or(cfg.MaxPayloadBytes, DefaultMaxPayloadBytes)
	cfg.DefaultMaxAttempts = cmp.Or(cfg.DefaultMaxAttempts, DefaultMaxAttempts)
	cfg.EventTopic = cmp.Or(cfg.EventTopic, DefaultEventTopic)

	cfg.NotifyInterval = cmp.Or(cfg.NotifyInterval, DefaultNotifyInterval)
	if cfg.ClaimIdleTimeout < 0 {
		return nil, fmt.Errorf("jobs: ClaimIdleTimeout is %s; use 0 for the default or a positive duration", cfg.ClaimIdleTimeout)
	}
	cfg.ClaimIdleTimeout = cmp.Or(cfg.ClaimIdleTimeout, DefaultClaimIdleTimeout)
	for _, k := range cfg.KindsWithoutEvents {
		if !validName(k, MaxKindLen) {
			return nil, fmt.Errorf("jobs: KindsWithoutEvents: kind %q: use letters, digits, '.', '_' and '-', at most %d bytes", k, MaxKindLen)
		}
	}
	// Never NULL: "kind = ANY (NULL)" is NULL, and NOT NULL would store no
	// flag at all.
	cfg.KindsWithoutEvents = append([]string{}, cfg.KindsWithoutEvents...)
	s := &PostgresStore{
		cfg:     cfg,
		queues:  queues,
		channel: schema.Channel("jobs"),
		notify:  newNotifyLimiter(cfg.DisableNotify, cfg.NotifyInterval),
		sql:     sql,

		claimLockTimeout: claimLockTimeout,
	}
	return s, nil
}

// Config returns the store's configuration with defaults filled in.
func (s *PostgresStore) Config() Config {
	cfg := s.cfg
	cfg.Queues = slices.Clone(cfg.Queues)
	return cfg
}

// Channel is the NOTIFY channel Enqueue signals on when it accepts a job;
// the payload is the job's queue. Notifications are delivered on commit.
func (s *PostgresStore) Channel() string { return s.channel }

// Enqueue implements Store. It is one statement: atomic on its own and
// part of the caller's transaction when db is one. Under REPEATABLE READ or
// SERIALIZABLE, a key taken by a concurrent transaction surfaces as a
// serialization failure for the caller to retry; READ COMMITTED (Postgres'
// default) resolves it to the existing job.
func (s *PostgresStore) Enqueue(ctx context.Context, db DBTX, params EnqueueParams) (EnqueueResult, error) {
	res, err := s.EnqueueMany(ctx, db, []EnqueueParams{params})
	if err != nil {
		return EnqueueResult{}, err
	}
	return res[0], nil
}

// EnqueueMany implements Store. A batch of one runs as one statement; a
// larger batch runs in a transaction (a savepoint inside the caller's), so
// an idempotency conflict anywhere writes nothing and leaves the caller's
// transaction usable.
func (s *PostgresStore) EnqueueMany(ctx context.Context, db DBTX, params []EnqueueParams) ([]EnqueueResult, error) {
	batch, err := s.prepare(params)
	if err != nil {
		return nil, err
	}
	return s.enqueueBatch(ctx, db, batch)
}

// enqueueBatch inserts a validated batch and runs Config.OnAccept on what
// it accepted, atomically: EnqueueMany's work, and EnqueueBatch's.
func (s *PostgresStore) enqueueBatch(ctx context.Context, db DBTX, batch *insertBatch) ([]EnqueueResult, error) {
	if len(batch.ids) == 1 && s.cfg.OnAccept == nil {
		return s.insert(ctx, db, batch)
	}
	var results []EnqueueResult
	err := dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		var err error
		results, err = s.insert(ctx, tx, batch)
		if err != nil || s.cfg.OnAccept == nil {
			return err
		}
		var accepted []*Job
		for _, r := range results {
			if !r.Existing {
				accepted = append(accepted, r.Job)
			}
		}
		if len(accepted) == 0 {
			return nil
		}
		return s.cfg.OnAccept(ctx, tx, accepted)
	})
	if err != nil {
		var conflict *ConflictError
		if errors.As(err, &conflict) || errors.Is(err, ErrInvalidParams) {
			return nil, err
		}
		return nil, fmt.Errorf("jobs: enqueue: %w", err)
	}
	return results, nil
}

// insertBatch is a validated batch in the column arrays InsertJobs takes.
type insertBatch struct {
	ids, eventIDs                    []pgtype.UUID // see dbsql.UUID
	tenants, kinds, queues, payloads []string
	keys, hashes, groupKeys          []*string
	priorities                       []int16
	maxAttempts                      []int32
	availableAt, deadlineAt          []*time.Time
	estimatedTokens                  []int64
	derivedHash                      []bool    // the request hash was derived from kind and payload
	reuseKeys                        []*string // Reuse.Key, NULL for a job without Reuse
	reuseShared                      []*bool
	reuseTTLs                        []*int64    // milliseconds
	batchID                          pgtype.UUID // the batch every job of it belongs to (EnqueueBatch), or NULL
}

// args is InsertJobs' arguments, in order: the batch's arrays, then the
// event topic, the notify channel, the queues to notify, the caller's trace
// parent, the kinds that write no events and the batch. statements declares its
// argument types from it.
func (b *insertBatch) args(topic, channel string, notify []string, traceParent *string, withoutEvents []string) []any {
	return []any{
		b.ids, b.tenants, b.kinds, b.queues, b.priorities,
		b.keys, b.hashes, b.payloads, b.groupKeys, b.maxAttempts,
		b.availableAt, b.deadlineAt, b.estimatedTokens, b.eventIDs,
		topic, channel, notify, traceParent, withoutEvents, b.batchID,
		b.reuseKeys, b.reuseShared, b.reuseTTLs,
	}
}

// one is InsertJob's arguments for a batch of one job: InsertJobs' in
// the same order, each array's element instead of the array, whether the
// job writes events instead of the kinds that do not, and whether to
// notify its queue instead of the queues to notify.
func (b *insertBatch) one(topic, channel string, notify []string, traceParent *string, withoutEvents []string) []any {
	return []any{
		b.ids[0], b.tenants[0], b.kinds[0], b.queues[0], b.priorities[0],
		b.keys[0], b.hashes[0], b.payloads[0], b.groupKeys[0], b.maxAttempts[0],
		b.availableAt[0], b.deadlineAt[0], b.estimatedTokens[0], b.eventIDs[0],
		topic, channel, len(notify) > 0, traceParent, !slices.Contains(withoutEvents, b.kinds[0]), b.batchID,
		b.reuseKeys[0], b.reuseShared[0], b.reuseTTLs[0],
	}
}

// newInsertBatch is a batch of n zero jobs, for prepare to fill in (and,
// of one, for statements to declare InsertJob's argument types).
func newInsertBatch(n int) *insertBatch {
	return &insertBatch{
		ids: make([]pgtype.UUID, n), eventIDs: make([]pgtype.UUID, n),
		tenants: make([]string, n), kinds: make([]string, n), queues: make([]string, n), payloads: make([]string, n),
		keys: make([]*string, n), hashes: make([]*string, n), groupKeys: make([]*string, n),
		priorities: make([]int16, n), maxAttempts: make([]int32, n),
		availableAt: make([]*time.Time, n), deadlineAt: make([]*time.Time, n), estimatedTokens: make([]int64, n),
		derivedHash: make([]bool, n),
		reuseKeys:   make([]*string, n), reuseShared: make([]*bool, n), reuseTTLs: make([]*int64, n),
	}
}

func (s *PostgresStore) prepare(params []EnqueueParams) (*insertBatch, error) {
	switch {
	case len(params) == 0:
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "params", Problem: "the batch is empty"}
	case len(params) > MaxBatch:
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "params",
			Problem: fmt.Sprintf("the batch has %d jobs, more than the limit of %d", len(params), MaxBatch)}
	}
	now := time.Now()
	b := newInsertBatch(len(params))
	for i := range params {
		p, err := s.normalize(params[i], now)
		if err != nil {
			if len(params) > 1 {
				var fe *llmqtype.ValidationError
				if errors.As(err, &fe) {
					fe.Field = fmt.Sprintf("params[%d].%s", i, fe.Field)
				}
			}
			return nil, err
		}
		// UUIDv7 ids made by one process increase strictly, also within a
		// millisecond, so a batch's jobs sort in input order
		// (ListBatchJobs).
		jobID, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("jobs: new job id: %w", err)
		}
		eventID, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("jobs: new event id: %w", err)
		}
		b.ids[i], b.eventIDs[i] = dbsql.UUID(jobID), dbsql.UUID(eventID)
		b.tenants[i], b.kinds[i], b.queues[i], b.payloads[i] = p.Tenant, p.Kind, p.Queue, string(p.Payload)
		b.keys[i] = dbsql.NullIfZero(p.IdempotencyKey)
		b.hashes[i] = dbsql.NullIfZero(p.RequestHash)
		b.derivedHash[i] = params[i].IdempotencyKey != "" && params[i].RequestHash == ""
		b.groupKeys[i] = dbsql.NullIfZero(p.GroupKey)
		// normalize bounded both conversions.
		b.priorities[i] = int16(p.Priority)
		b.maxAttempts[i] = int32(p.MaxAttempts)
		b.availableAt[i] = dbsql.NullIfZero(p.AvailableAt)
		b.deadlineAt[i] = dbsql.NullIfZero(p.DeadlineAt)
		b.estimatedTokens[i] = p.EstimatedTokens
		if r := p.Reuse; r != nil {
			ttl := r.TTL.Milliseconds()
			b.reuseKeys[i], b.reuseShared[i], b.reuseTTLs[i] = &r.Key, &r.Shared, &ttl
		}
	}
	return b, nil
}

// insert runs InsertJobs (InsertJob for a batch of one) and resolves every
// job the statement did not insert to the job that already holds its
// idempotency key.
func (s *PostgresStore) insert(ctx context.Context, db DBTX, b *insertBatch) ([]EnqueueResult, error) {
	stmt, args := s.sql.insertJobs, b.args
	if len(b.ids) == 1 {
		stmt, args = s.sql.insertJob, b.one
	}
	rows, err := db.Query(ctx, stmt, args(s.cfg.EventTopic, s.channel,
		s.notify.queues(b.queues, time.Now()), dbsql.NullIfZero(telemetry.TraceParent(ctx)), s.cfg.KindsWithoutEvents)...)
	if err != nil {
		return nil, fmt.Errorf("jobs: enqueue: %w", s.explain(err))
	}
	inserted, err := pgx.CollectRows(rows, scanJobs())
	if err != nil {
		return nil, fmt.Errorf("jobs: enqueue: %w", s.explain(err))
	}
	results := make([]EnqueueResult, len(b.ids))
	if len(inserted) == len(b.ids) {
		byID := make(map[uuid.UUID]*Job, len(inserted))
		for _, j := range inserted {
			byID[j.ID] = j
		}
		for i, id := range b.ids {
			results[i] = EnqueueResult{Job: byID[id.Bytes]}
		}
		return results, nil
	}
	return s.resolveExisting(ctx, db, b, inserted, results)
}

type tenantKey struct{ tenant, key string }

// resolveExisting fills in the results of jobs whose key was taken: by a
// committed job (READ COMMITTED lets this second statement see it) or by an
// earlier job of the same batch.
func (s *PostgresStore) resolveExisting(ctx context.Context, db DBTX, b *insertBatch, inserted []*Job, results []EnqueueResult) ([]EnqueueResult, error) {
	insertedIDs := make(map[uuid.UUID]*Job, len(inserted))
	for _, j := range inserted {
		insertedIDs[j.ID] = j
	}
	var tenants, keys []string
	for i, id := range b.ids {
		if _, ok := insertedIDs[id.Bytes]; !ok {
			tenants = append(tenants, b.tenants[i])
			keys = append(keys, *b.keys[i]) // only keyed jobs can conflict
		}
	}
	rows, err := db.Query(ctx, s.sql.selectByKey, tenants, keys)
	if err != nil {
		return nil, fmt.Errorf("jobs: enqueue: reading existing jobs: %w", err)
	}
	existing, err := pgx.CollectRows(rows, scanJobs())
	if err != nil {
		return nil, fmt.Errorf("jobs: enqueue: reading existing jobs: %w", err)
	}
	byKey := make(map[tenantKey]*Job, len(existing))
	for _, j := range existing {
		byKey[tenantKey{j.Tenant, j.IdempotencyKey}] = j
	}
	for i, id := range b.ids {
		if j, ok := insertedIDs[id.Bytes]; ok {
			results[i] = EnqueueResult{Job: j}
			continue
		}
		k := tenantKey{b.tenants[i], *b.keys[i]}
		j, ok := byKey[k]
		if !ok {
			// The key's job_keys row has no job: the job was deleted between
			// the two statements (retry), or deleted without its job_keys
			// row, which keeps the key taken (see the package documentation).
			return nil, fmt.Errorf("%w: tenant %q key %q is held in job_keys by no job: it was released concurrently (retry), or its job was deleted without its job_keys row", ErrKeyReleased, k.tenant, k.key)
		}
		if j.RequestHash != dbsql.Deref(b.hashes[i]) {
			return nil, &ConflictError{Index: i, Tenant: k.tenant, IdempotencyKey: k.key, ExistingJobID: j.ID, DerivedHash: b.derivedHash[i]}
		}
		// Existing also when the holder is an earlier job of this batch:
		// nothing was written for this element.
		results[i] = EnqueueResult{Job: j, Existing: true}
	}
	return results, nil
}

// Get implements Store.
func (s *PostgresStore) Get(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Job, error) {
	rows, err := db.Query(ctx, s.sql.get, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("jobs: get %s: %w", id, s.explain(err))
	}
	job, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s for tenant %q", ErrNotFound, id, tenant)
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: get %s: %w", id, s.explain(err))
	}
	return job, nil
}

// List implements Store.
func (s *PostgresStore) List(ctx context.Context, db DBTX, params ListParams) (*ListResult, error) {
	if p := checkText(params.Tenant, true, MaxTenantLen); p != "" {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Tenant", Problem: p}
	}
	page, err := newListPage(params.States, params.Limit, params.Cursor, "List")
	if err != nil {
		return nil, err
	}
	return s.fetchPage(ctx, db, "list", s.sql.list, page, params.Tenant, page.states, params.Kind)
}

// listPage is what List and ListAll validate alike: the states, the page
// size and where the page starts.
type listPage struct {
	states []string
	limit  int
	after  *uuid.UUID
}

// newListPage validates a listing's states, limit and cursor; by names
// the method whose cursor is expected.
func newListPage(states []State, limit int, cursor, by string) (listPage, error) {
	fail := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	page := listPage{states: make([]string, 0, len(states)), limit: cmp.Or(limit, defaultListLimit)}
	for _, st := range states {
		if !st.Valid() {
			return listPage{}, fail("States", fmt.Sprintf("%q is not a state", st))
		}
		page.states = append(page.states, string(st))
	}
	if page.limit < 1 || page.limit > MaxListLimit {
		return listPage{}, fail("Limit", fmt.Sprintf("is %d; use 1 to %d", limit, MaxListLimit))
	}
	if cursor != "" {
		id, err := uuid.Parse(cursor)
		if err != nil {
			return listPage{}, fail("Cursor", "is not a cursor returned by "+by)
		}
		page.after = &id
	}
	return page, nil
}

// fetchPage runs a listing statement with args, then the page's cursor and
// one row more than its limit, and cuts the page, whose next cursor is set
// when that extra row came back.
func (s *PostgresStore) fetchPage(ctx context.Context, db DBTX, op, query string, page listPage, args ...any) (*ListResult, error) {
	rows, err := db.Query(ctx, query, append(args, page.after, page.limit+1)...)
	if err != nil {
		return nil, fmt.Errorf("jobs: %s: %w", op, s.explain(err))
	}
	jobs, err := pgx.CollectRows(rows, scanJobs())
	if err != nil {
		return nil, fmt.Errorf("jobs: %s: %w", op, s.explain(err))
	}
	res := &ListResult{Jobs: jobs}
	if len(jobs) > page.limit {
		res.Jobs = jobs[:page.limit]
		res.NextCursor = jobs[page.limit-1].ID.String()
	}
	return res, nil
}

// Cancel implements Store. READY and RETRY_SCHEDULED jobs become CANCELLED
// with a "<kind>.cancelled" event. A RUNNING job records the request
// (CancelRequested) and stays RUNNING until its runner honours it. A
// CANCELLED job is returned as it is; any other terminal job is returned
// with ErrAlreadyFinished.
func (s *PostgresStore) Cancel(ctx context.Context, db DBTX, tenant string, id uuid.UUID) (*Job, error) {
	eventID, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("jobs: new event id: %w", err)
	}
	rows, err := db.Query(ctx, s.sql.cancel, tenant, id, eventID, s.cfg.EventTopic)
	if err != nil {
		return nil, fmt.Errorf("jobs: cancel %s: %w", id, s.explain(err))
	}
	job, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s for tenant %q", ErrNotFound, id, tenant)
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: cancel %s: %w", id, err)
	}
	if job.State.Terminal() && job.State != StateCancelled {
		return job, fmt.Errorf("%w: %s is %s", ErrAlreadyFinished, id, job.State)
	}
	return job, nil
}

// Stats implements Store.
// Waiting and running jobs are counted exactly; finished jobs only within
// StatsWindow, so its cost follows the backlog and the recent rate, not the
// history.
func (s *PostgresStore) Stats(ctx context.Context, db DBTX) ([]QueueStats, error) {
	rows, err := db.Query(ctx, s.sql.stats)
	if err != nil {
		return nil, fmt.Errorf("jobs: stats: %w", s.explain(err))
	}
	defer rows.Close()
	var out []QueueStats
	for rows.Next() {
		var (
			queue, state string
			count        int64
			ageSeconds   float64
		)
		if err := rows.Scan(&queue, &state, &count, &ageSeconds); err != nil {
			return nil, fmt.Errorf("jobs: stats: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Queue != queue {
			out = append(out, QueueStats{Queue: queue, Counts: map[State]int64{}})
		}
		qs := &out[len(out)-1]
		qs.Counts[State(state)] = count
		qs.OldestEligibleAge = max(qs.OldestEligibleAge, time.Duration(ageSeconds*float64(time.Second)))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("jobs: stats: %w", s.explain(err))
	}
	return out, nil
}

// scanJob reads the column list every job query returns (job_columns),
// in the order jobRow.dest gives. It is for one row; scanJobs is for many.
func scanJob(row pgx.CollectableRow) (*Job, error) {
	var r jobRow
	if err := row.Scan(r.dest()...); err != nil {
		return nil, err
	}
	return r.job(), nil
}

// scanJobs returns scanJob for the rows of one query: the row it scans
// into and its destinations are made once and reused, row after row,
// where scanJob makes both (about 1.2 KB) for every row.
func scanJobs() pgx.RowToFunc[*Job] {
	var r jobRow
	dest := r.dest()
	return func(row pgx.CollectableRow) (*Job, error) {
		r = jobRow{} // the destinations point into r; nothing of a row scanned before may stay
		if err := row.Scan(dest...); err != nil {
			return nil, err
		}
		return r.job(), nil
	}
}
