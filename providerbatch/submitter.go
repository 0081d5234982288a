package providerbatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/outcome"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
)

// Submitter sends the jobs waiting in its queue to the provider's batch
// API and applies the results. Run one in every process that may; the one
// holding the pool's lease works, the others stand by.
type Submitter struct {
	cfg    Config
	pool   *pgxpool.Pool
	store  jobs.RunnerStore
	sql    statements
	calls  map[string]batchedCall
	kinds  []string
	limits Limits
	policy outcome.Policy
	ledger *admission.BatchLedger
	worker string
	logger *slog.Logger

	epoch      int64 // the lease's epoch while held, 0 while standing by
	lastGather time.Time
}

// errLeaseLost ends a pass whose writes found the lease taken over.
var errLeaseLost = errors.New("providerbatch: the pool's lease passed to another submitter")

// NewSubmitter returns a submitter for cfg on pool, recording outcomes
// through store (the host's jobs.PostgresStore).
func NewSubmitter(pool *pgxpool.Pool, store jobs.RunnerStore, cfg Config) (*Submitter, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if pool == nil || store == nil {
		return nil, fmt.Errorf("%w: a pool and a store are required", ErrInvalidConfig)
	}
	schema, err := dbsql.NewSchema(cfg.Schema)
	if err != nil {
		return nil, errors.Join(ErrInvalidConfig, err)
	}
	s := &Submitter{
		cfg: cfg, pool: pool, store: store,
		calls:  map[string]batchedCall{},
		limits: cfg.Provider.Limits().min(cfg.Limits),
		worker: "providerbatch:" + cfg.Pool,
		logger: cfg.Logger.With("pool", cfg.Pool, "submitter", cfg.ID),
	}
	if _, err := s.sql.load(schema); err != nil {
		return nil, fmt.Errorf("providerbatch: %w", err)
	}
	if s.ledger, err = admission.NewBatchLedger(schema.Name()); err != nil {
		return nil, fmt.Errorf("providerbatch: %w", err)
	}
	for _, c := range cfg.Calls {
		s.calls[c.kind] = c.batched
		s.kinds = append(s.kinds, c.kind)
	}
	s.policy = outcome.Policy{
		Worker:                s.worker,
		Backoff:               cfg.backoff,
		InvalidOutputAttempts: cfg.InvalidOutputAttempts,
		FailInvalidOutput:     cfg.InvalidOutput == lease.InvalidOutputFail,
	}
	return s, nil
}

// Worker is the lease holder the jobs in this pool's batches name.
func (s *Submitter) Worker() string { return s.worker }

// Run works until ctx ends: it takes or renews the pool's lease and,
// while it holds it, sends waiting jobs, polls submitted batches and
// applies their results. It releases the lease when ctx ends and returns
// nil then.
func (s *Submitter) Run(ctx context.Context) error {
	tick := min(s.cfg.LeaseDuration/3, s.cfg.PollMin, s.cfg.GatherInterval)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			s.release(context.WithoutCancel(ctx))
			return nil
		case <-timer.C:
		}
		if err := s.Pass(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("llmq: provider batch pass failed; trying again", "err", err)
		}
		timer.Reset(tick)
	}
}

// Pass takes or renews the lease and, if held, does one round of work:
// batches left preparing are resumed, batches due are polled and applied,
// and, every GatherInterval, waiting jobs are sent. Run calls it; tests
// call it to step a submitter.
func (s *Submitter) Pass(ctx context.Context) error {
	held, err := s.takeLease(ctx)
	if err != nil || !held {
		return err
	}
	open, err := s.open(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, sub := range open {
		if sub.nextPollAt.After(now) {
			continue
		}
		if err := s.work(ctx, sub); err != nil {
			if errors.Is(err, errLeaseLost) || ctx.Err() != nil {
				return err
			}
			s.logger.Warn("llmq: provider batch submission", "submission", sub.id, "err", err)
		}
	}
	if now.Sub(s.lastGather) < s.cfg.GatherInterval {
		return nil
	}
	s.lastGather = now
	return s.gather(ctx, open)
}

// takeLease takes or renews the pool's lease; held says whether this
// submitter holds it now.
func (s *Submitter) takeLease(ctx context.Context) (held bool, err error) {
	var epoch int64
	err = s.pool.QueryRow(ctx, s.sql.takeLease, s.cfg.Pool, s.cfg.ID, s.cfg.LeaseDuration.Milliseconds()).Scan(&epoch)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if s.epoch != 0 {
			s.logger.Warn("llmq: another submitter holds the pool's batch lease; standing by")
		}
		s.epoch = 0
		return false, nil
	case err != nil:
		return false, fmt.Errorf("providerbatch: taking the lease of pool %s: %w", s.cfg.Pool, err)
	}
	if epoch != s.epoch {
		s.logger.Info("llmq: holding the pool's batch lease", "epoch", epoch)
		s.lastGather = time.Time{}
	}
	s.epoch = epoch
	return true, nil
}

// release frees the lease for a standby.
func (s *Submitter) release(ctx context.Context) {
	if s.epoch == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.pool.Exec(ctx, s.sql.releaseLease, s.cfg.Pool, s.cfg.ID, s.epoch); err != nil {
		s.logger.Warn("llmq: releasing the pool's batch lease; a standby takes over when it lapses", "err", err)
	}
	s.epoch = 0
}

// underLease runs fn in a transaction that holds the lease row (HoldLease):
// errLeaseLost if the lease passed on.
func (s *Submitter) underLease(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return dbsql.WithTx(ctx, s.pool, func(tx pgx.Tx) error {
		var epoch int64
		err := tx.QueryRow(ctx, s.sql.holdLease, s.cfg.Pool, s.cfg.ID, s.epoch).Scan(&epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			s.epoch = 0
			return errLeaseLost
		}
		if err != nil {
			return fmt.Errorf("providerbatch: holding the lease: %w", err)
		}
		return fn(tx)
	})
}

// open reads the pool's open submissions.
func (s *Submitter) open(ctx context.Context) ([]openRow, error) {
	open, err := query[openRow](ctx, s.pool, s.sql.openSubmissions, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading open submissions: %w", err)
	}
	return open, nil
}

// pollDelay is the delay before poll n+1 of a batch: PollMin growing by
// half each poll, up to PollMax.
func (s *Submitter) pollDelay(polls int32) time.Duration {
	d := float64(s.cfg.PollMin)
	for range min(polls, 40) {
		d *= 1.5
		if d >= float64(s.cfg.PollMax) {
			return s.cfg.PollMax
		}
	}
	return time.Duration(d)
}
