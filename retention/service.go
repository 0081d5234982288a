package retention

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

//go:embed queries.sql
var queriesSQL string

// Defaults and bounds of Config.
const (
	DefaultInterval  = time.Minute
	DefaultBatchSize = 1000
	MaxBatchSize     = 10_000
)

// ErrNotHolder is returned by PruneOnce when another process holds the
// retention lease, or this one lost it during the pass.
var ErrNotHolder = errors.New("retention: another process holds the retention lease")

// Config configures a Service. Its zero value (with a pool) is a service
// on the default schema with the default Policy.
type Config struct {
	// Schema is the llmq schema ("" is the default).
	Schema string
	// ID names this process in the lease. Default host/pid/random.
	ID string
	// Policy is how long each class of rows is kept.
	Policy Policy
	// Interval is the time between passes, and between a standby's checks
	// of the lease. Default 1 minute.
	Interval time.Duration
	// Lease is how long the lease holds without a renewal; every batch
	// renews it. A process that stops renewing (it died) is replaced after
	// at most Lease plus a standby's Interval. Default 3×Interval; at least
	// Interval.
	Lease time.Duration
	// BatchSize is the most rows one batch deletes of one class (jobs
	// count with their attempts and keys). Default 1,000; at most 10,000.
	BatchSize int
	// BatchPause is a pause between batches, to spread a large backlog's
	// deletes out. Default none; less than half of Lease, since the lease
	// is renewed only by batches.
	BatchPause time.Duration
	// Logger receives warnings and errors. Default slog.Default().
	Logger *slog.Logger
	// OneOff marks a service that runs single passes by hand (llmq prune)
	// with a policy of its own: it takes the lease like any other, so it
	// never prunes beside the running service, but it leaves the lease
	// row's recorded policy and last pass alone. They stay the running
	// service's, which operators read (llmq stats) and llmq prune starts
	// from. Default false: a Service records its policy when it takes or
	// renews the lease, and each pass when it ends.
	OneOff bool
}

// Service is the maintenance service. Run it in every runner process: of
// all services on one schema, the one holding the retention lease prunes,
// the others stand by.
type Service struct {
	pool *pgxpool.Pool
	cfg  Config
	sql  statements

	jobs      *jobs.Pruner
	outbox    *outbox.Pruner
	inbox     *inbox.Pruner
	webhook   *webhook.Pruner
	admission *admission.Pruner

	beforeCommit func(pgx.Tx) // tests only: runs inside each batch's transaction
}

// New validates cfg once and returns a service on pool.
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if pool == nil {
		return nil, invalid("pool", "is nil; New needs a pool")
	}
	policy, err := cfg.Policy.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Policy = policy
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Interval", cfg.Interval}, {"Lease", cfg.Lease}, {"BatchPause", cfg.BatchPause}} {
		if f.d < 0 {
			return nil, invalid(f.name, "is %s; use 0 for the default or a positive duration", f.d)
		}
	}
	if cfg.BatchSize < 0 || cfg.BatchSize > MaxBatchSize {
		return nil, invalid("BatchSize", "is %d; use 0 for the default or 1 to %d", cfg.BatchSize, MaxBatchSize)
	}
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.Lease = cmp.Or(cfg.Lease, 3*cfg.Interval)
	if cfg.Lease < cfg.Interval {
		return nil, invalid("Lease", "is %s, shorter than Interval %s; the holder would lose it between passes", cfg.Lease, cfg.Interval)
	}
	// Every batch renews the lease, and the pause between two batches is
	// time without a renewal: a pause of half the lease or more leaves too
	// little for the next batch to renew it before it lapses, and the
	// holder would lose the lease to a standby in the middle of a pass.
	if cfg.BatchPause >= cfg.Lease/2 {
		return nil, invalid("BatchPause", "is %s; use less than half of Lease (%s), or the lease lapses between batches", cfg.BatchPause, cfg.Lease)
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	if cfg.ID == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		cfg.ID = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Service{pool: pool, cfg: cfg}
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, &ConfigError{Field: "Schema", Problem: err.Error()}
	}
	if _, err := s.sql.load(schema); err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	if s.jobs, err = jobs.NewPruner(cfg.Schema); err != nil {
		return nil, err
	}
	if s.outbox, err = outbox.NewPruner(cfg.Schema); err != nil {
		return nil, err
	}
	if s.inbox, err = inbox.NewPruner(cfg.Schema); err != nil {
		return nil, err
	}
	if s.webhook, err = webhook.NewPruner(cfg.Schema); err != nil {
		return nil, err
	}
	if s.admission, err = admission.NewPruner(cfg.Schema); err != nil {
		return nil, err
	}
	return s, nil
}

// Policy returns the policy in force, defaults filled in.
func (s *Service) Policy() Policy { return s.cfg.Policy }

// ID returns the name this service holds the lease under.
func (s *Service) ID() string { return s.cfg.ID }

// Run prunes until ctx ends: every Interval it takes (or renews) the
// lease and, if it holds it, runs a pass; otherwise it stands by. When
// ctx ends it releases the lease, so another process takes over at its
// next check. A failed pass is logged and tried again at the next
// interval; Run returns nil when ctx ends.
func (s *Service) Run(ctx context.Context) error {
	for {
		s.pass(ctx)
		if !retry.Sleep(ctx, s.cfg.Interval) {
			s.release(ctx)
			return nil
		}
	}
}

// pass runs one pass for Run and logs its failure, unless ctx ended it.
func (s *Service) pass(ctx context.Context) {
	_, err := s.PruneOnce(ctx)
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, ErrNotHolder):
		s.cfg.Logger.Debug("llmq: retention standing by; another process holds the lease", "check_every", s.cfg.Interval)
	case err != nil:
		s.cfg.Logger.Warn("llmq: retention pass failed; trying again", "err", err, "retry_in", s.cfg.Interval)
	}
}

// release gives the lease up at the end of Run, on a context of its own:
// ctx has ended.
func (s *Service) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.Release(ctx); err != nil {
		s.cfg.Logger.Warn("llmq: retention could not release its lease; another process takes over when it lapses", "err", err, "lease", s.cfg.Lease)
	}
}

// Release gives up the lease if this service holds it, so another process
// takes over at its next check. Run does it when its context ends; call
// it after PruneOnce when no Run follows.
func (s *Service) Release(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, s.sql.releaseLease, s.cfg.ID); err != nil {
		return fmt.Errorf("retention: releasing the lease: %w", err)
	}
	return nil
}

// Count is the rows of one class a pass deleted, or a dry run found due.
type Count struct {
	Table string `json:"table"`
	Class string `json:"class,omitempty"` // the job state, "published", "unpublished", "expired"
	Rows  int64  `json:"rows"`
}

// Pass is what one pass deleted.
type Pass struct {
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Batches  int           `json:"batches"`
	Deleted  []Count       `json:"deleted"`
}

// Total is the number of rows the pass deleted.
func (p Pass) Total() int64 {
	var n int64
	for _, c := range p.Deleted {
		n += c.Rows
	}
	return n
}

// PruneOnce takes (or renews) the lease and, holding it, deletes every
// row due under the policy, batch by batch, and records the pass in the
// lease row (unless OneOff). It returns ErrNotHolder when another process holds the lease
// (nothing was deleted), or when the lease was lost during the pass (the
// batches already committed stay deleted: each was due). It uses one
// pooled connection at a time.
func (s *Service) PruneOnce(ctx context.Context) (Pass, error) {
	pass := Pass{Started: time.Now()}
	// JSON as json.RawMessage, not []byte: pgx sends a []byte as bytea
	// where it does not know the parameter's type (its exec and simple
	// protocol modes).
	var policy json.RawMessage // NULL: keep the recorded policy (OneOff)
	if !s.cfg.OneOff {
		var err error
		if policy, err = json.Marshal(s.cfg.Policy); err != nil {
			return pass, fmt.Errorf("retention: %w", err)
		}
	}
	var held bool
	err := s.pool.QueryRow(ctx, s.sql.acquireLease, s.cfg.ID, s.cfg.Lease.Milliseconds(), policy).Scan(&held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return pass, ErrNotHolder
	case err != nil:
		return pass, fmt.Errorf("retention: taking the lease: %w", err)
	}
	for _, c := range s.classes() {
		deleted, err := s.drain(ctx, &pass, c)
		pass.Deleted = addCounts(pass.Deleted, deleted)
		if err != nil {
			pass.Duration = time.Since(pass.Started)
			return pass, err
		}
	}
	pass.Duration = time.Since(pass.Started)
	if s.cfg.OneOff {
		return pass, nil
	}
	record, err := json.Marshal(pass)
	if err != nil {
		return pass, fmt.Errorf("retention: %w", err)
	}
	if _, err := s.pool.Exec(ctx, s.sql.recordPass, s.cfg.ID, json.RawMessage(record)); err != nil {
		return pass, fmt.Errorf("retention: recording the pass: %w", err)
	}
	return pass, nil
}

// class is one class of rows a pass deletes: batch deletes up to limit
// rows in tx, reports what it deleted, and whether there may be more (a
// batch that deleted fewer than limit rows of its main table ends the
// class).
type class struct {
	batch func(ctx context.Context, tx pgx.Tx, limit int) (more bool, all []Count, err error)
}

// classes lists what the policy prunes, jobs first (they are most of the
// rows), in a fixed order.
func (s *Service) classes() []class {
	p := s.cfg.Policy
	var cs []class
	for _, state := range finishedStates {
		keep := p.Job(state)
		if keep == Never {
			continue
		}
		cs = append(cs, class{func(ctx context.Context, tx pgx.Tx, limit int) (bool, []Count, error) {
			r, err := s.jobs.PruneFinished(ctx, tx, state, keep, limit)
			return r.Jobs == int64(limit), []Count{
				{Table: "jobs", Class: string(state), Rows: r.Jobs},
				{Table: "job_attempts", Rows: r.Attempts},
				{Table: "job_keys", Rows: r.Keys},
				{Table: "job_steps", Rows: r.Steps},
			}, err
		}})
	}
	type pruneFunc = func(context.Context, dbsql.DBTX, time.Duration, int) (n int64, more bool, err error)
	one := func(table, cls string, keep time.Duration, prune pruneFunc) {
		if keep == Never {
			return
		}
		cs = append(cs, class{func(ctx context.Context, tx pgx.Tx, limit int) (bool, []Count, error) {
			n, more, err := prune(ctx, tx, keep, limit)
			return more, []Count{{Table: table, Class: cls, Rows: n}}, err
		}})
	}
	// Rows deleted up to the limit: there may be more.
	rows := func(prune func(context.Context, dbsql.DBTX, time.Duration, int) (int64, error)) pruneFunc {
		return func(ctx context.Context, db dbsql.DBTX, keep time.Duration, limit int) (int64, bool, error) {
			n, err := prune(ctx, db, keep, limit)
			return n, n == int64(limit), err
		}
	}
	// An outbox call counts events, a batch row's by its events, and says
	// itself whether a limit was reached.
	events := func(prune func(context.Context, outbox.DBTX, time.Duration, int) (outbox.PruneResult, error)) pruneFunc {
		return func(ctx context.Context, db dbsql.DBTX, keep time.Duration, limit int) (int64, bool, error) {
			r, err := prune(ctx, db, keep, limit)
			return r.Events, r.More, err
		}
	}
	one("job_batches", "", p.Batches(), rows(s.jobs.PruneBatches))
	one("job_reuse_invalidations", "", jobs.ReuseInvalidationRetention(p.Job(jobs.StateSucceeded)), rows(s.jobs.PruneReuseInvalidations))
	one("outbox", "published", p.PublishedEvents, events(s.outbox.PrunePublished))
	one("outbox", "unpublished", p.UnrelayedEvents, events(s.outbox.PruneUnrelayed))
	one("inbox", "", p.InboxRecords, rows(s.inbox.Prune))
	one("inbox_quarantine", "", p.InboxQuarantine, rows(s.inbox.PruneQuarantine))
	one("webhook_deliveries", "", p.WebhookDeliveries, rows(s.webhook.Prune))
	return append(cs, s.expiredPermits())
}

// expiredPermits reaps expired permits, every one due: a batch takes one
// pool's (up to the batch size), so a batch locks one pool row, and the
// class walks the pools by name.
func (s *Service) expiredPermits() class {
	after := ""
	return class{func(ctx context.Context, tx pgx.Tx, limit int) (bool, []Count, error) {
		pool, n, err := s.admission.ReapExpiredBatch(ctx, tx, after, limit)
		if err != nil || pool == "" {
			return false, nil, err
		}
		if n < int64(limit) { // this pool is done (or its rest is locked): on to the next
			after = pool
		}
		return true, []Count{{Table: "admission_permits", Class: "expired", Rows: n}}, nil
	}}
}

// drain runs c's batches until one comes up short, each in a transaction
// of its own fenced by the lease, and sums what they deleted.
func (s *Service) drain(ctx context.Context, pass *Pass, c class) ([]Count, error) {
	var sum []Count
	for {
		var more bool
		var counts []Count
		err := dbsql.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
			var held bool
			err := tx.QueryRow(ctx, s.sql.fenceBatch, s.cfg.ID, s.cfg.Lease.Milliseconds()).Scan(&held)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotHolder
			}
			if err != nil {
				return fmt.Errorf("retention: renewing the lease: %w", err)
			}
			if more, counts, err = c.batch(ctx, tx, s.cfg.BatchSize); err != nil {
				return err
			}
			if s.beforeCommit != nil {
				s.beforeCommit(tx)
			}
			return nil
		})
		if err != nil {
			return sum, err
		}
		pass.Batches++
		sum = addCounts(sum, counts)
		if !more {
			return sum, nil
		}
		if s.cfg.BatchPause > 0 && !retry.Sleep(ctx, s.cfg.BatchPause) {
			return sum, ctx.Err()
		}
	}
}

// addCounts adds b to a, row by row in b's order, leaving out empty rows.
func addCounts(a, b []Count) []Count {
next:
	for _, c := range b {
		if c.Rows == 0 {
			continue
		}
		for i := range a {
			if a[i].Table == c.Table && a[i].Class == c.Class {
				a[i].Rows += c.Rows
				continue next
			}
		}
		a = append(a, c)
	}
	return a
}
