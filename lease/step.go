package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// A step's output is stored after its function returned, on the pool the
// runner claims on. A store that fails for the database's trouble (a lost
// connection, a restart: dberr.Connection) is tried again for as long as
// the attempt lasts, pausing from stepSavePause, doubling, to
// maxStepSavePause: the output is in hand, and losing it would mean paying
// for the step again.
const (
	stepSavePause    = 100 * time.Millisecond
	maxStepSavePause = time.Second
)

// StepConfig configures one Step. The zero value runs the step without a
// permit of its own.
type StepConfig struct {
	// Admission, when set, is the request the step's provider call makes:
	// the step runs holding a permit of Admission.Pool from the runner's
	// Config.Admission limiter, waited for, settled and turned into
	// snoozes as an admitted attempt's is (see Admission), and released
	// with the usage the step recorded. A step whose output is reused takes
	// no permit. Route the kind itself to no pool (ok false) when its
	// steps carry their own requests, or each attempt would hold two.
	Admission *admission.Request
}

// stepKey finds an attempt's step scope in its context.
type stepKey struct{}

// stepScope is what a Step needs of the attempt it runs in.
type stepScope struct {
	r   *Runner
	job *jobs.Job
}

// Step runs fn at most once to success for the job whose attempt ctx
// belongs to. When fn returns, its output is stored for the job under the
// attempt's fence; a later attempt of the job gets the stored output back
// without calling fn, so a retry pays only for the steps that had not
// succeeded. Name the steps of a handler uniquely and stably ("ocr",
// "extract"): the name is the step's identity across attempts.
//
// What Step returns is always the stored output decoded into T, so the
// attempt that ran the step and the attempts that reuse it see the same
// value; T must survive a JSON round trip. An error from fn is returned as
// it is and nothing is stored: the step runs again on the next attempt.
// Return Step's errors from the handler as they are (or wrapped), since
// they say how the attempt ends:
//
//   - an attempt that is no longer the job's current one (its lease was
//     lost; the job has moved to a newer attempt) gets an error wrapping
//     jobs.ErrLeaseLost and neither reuses nor stores anything, before or
//     after fn ran;
//   - a step with StepConfig.Admission may get a *jobs.SnoozeError (no
//     permit soon), which puts the job off without counting the attempt;
//     the steps stored so far stay stored;
//   - an output that cannot be stored (not JSON jsonb holds, over
//     jobs.MaxStepOutputBytes) fails the job at once (jobs.Permanent):
//     the same output would fail again on every retry, and each would pay
//     for it.
//
// fn's context carries the attempt's: its deadline, logger and span.
// Usage recorded inside fn (RecordUsage) is stored with the step and
// counts for the attempt that ran it; a reused step costs its attempt
// nothing. Outside an attempt run by a Runner (a handler called directly
// in a unit test) Step calls fn and stores nothing.
func Step[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	return StepWith(ctx, name, StepConfig{}, fn)
}

// StepWith is Step with a configuration: a step that makes a provider call
// of its own pool (StepConfig.Admission).
func StepWith[T any](ctx context.Context, name string, cfg StepConfig, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	run := func(ctx context.Context) (json.RawMessage, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		out, err := json.Marshal(v)
		if err != nil {
			return nil, jobs.Permanent(fmt.Errorf("lease: step %q: encoding its output: %w", name, err))
		}
		return out, nil
	}
	sc, ok := ctx.Value(stepKey{}).(*stepScope)
	if !ok {
		return fn(ctx)
	}
	out, err := sc.run(ctx, name, cfg, run)
	if err != nil {
		return zero, err
	}
	var v T
	if err := json.Unmarshal(out, &v); err != nil {
		return zero, jobs.Permanent(fmt.Errorf("lease: step %q: its stored output does not decode into %T: %w", name, v, err))
	}
	return v, nil
}

// run takes the step's stored output, or runs it and stores what it
// returned.
func (sc *stepScope) run(ctx context.Context, name string, cfg StepConfig, fn func(ctx context.Context) (json.RawMessage, error)) (json.RawMessage, error) {
	lease := jobs.Lease{JobID: sc.job.ID, Fence: sc.job.Fence}
	if cfg.Admission != nil && sc.r.cfg.Admission == nil {
		return nil, jobs.Permanent(fmt.Errorf("lease: step %q asks for a permit of pool %q, but the runner has no Config.Admission", name, cfg.Admission.Pool))
	}
	taken, err := withConn(ctx, sc.r, func() (takenStep, error) {
		st, found, err := sc.r.store.TakeStep(ctx, sc.r.pool, jobs.StepParams{Lease: lease, Name: name})
		return takenStep{st, found}, err
	})
	if err != nil {
		return nil, stepError(ctx, name, "reading", err)
	}
	if taken.found {
		Logger(ctx).Debug("llmq: step reused", "step", name, "stored_by_attempt", taken.step.Attempt)
		return taken.step.Output, nil
	}

	parent, _ := ctx.Value(usageKey{}).(*usageRecorder)
	recorder := &usageRecorder{parent: parent}
	stepCtx := context.WithValue(ctx, usageKey{}, recorder)
	var out json.RawMessage
	if cfg.Admission != nil {
		out, err = sc.r.cfg.Admission.underPermit(stepCtx, *cfg.Admission, fn)
	} else {
		out, err = fn(stepCtx)
	}
	if err != nil {
		return nil, err
	}
	candidate, _ := CandidateOf(ctx)
	saved, err := sc.save(ctx, jobs.SaveStepParams{Lease: lease, Name: name, Output: out, Usage: recorder.get(), Candidate: candidate.Name})
	if err != nil {
		return nil, err
	}
	return saved.Output, nil
}

// takenStep is TakeStep's answer, carried through withConn.
type takenStep struct {
	step  jobs.Step
	found bool
}

// save stores a step's output, trying again while the database fails it
// for its own trouble and the attempt's context lasts (it ends with the
// attempt's timeout, or once the lease must have run out).
func (sc *stepScope) save(ctx context.Context, p jobs.SaveStepParams) (jobs.Step, error) {
	pause := stepSavePause
	for try := 1; ; try++ {
		saved, err := withConn(ctx, sc.r, func() (jobs.Step, error) {
			return sc.r.store.SaveStep(ctx, sc.r.pool, p)
		})
		if err == nil {
			return saved, nil
		}
		var invalid *llmqtype.ValidationError
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &invalid):
			return jobs.Step{}, jobs.Permanent(fmt.Errorf("lease: step %q returned an output the store cannot keep: %w", p.Name, err))
		case errors.Is(err, jobs.ErrLeaseLost), errors.As(err, &pgErr) && !dberr.Connection(err), ctx.Err() != nil:
			return jobs.Step{}, stepError(ctx, p.Name, "storing", err)
		}
		Logger(ctx).Warn("llmq: storing a step's output failed; trying again", "step", p.Name, "try", try, "err", err)
		if !retry.Sleep(ctx, pause) {
			return jobs.Step{}, stepError(ctx, p.Name, "storing", err)
		}
		pause = min(2*pause, maxStepSavePause)
	}
}

// stepError says what failed; when the attempt's context ended, it wraps
// the reason too (ErrLeaseLost, ErrAttemptTimeout), which the statement's
// own error (a cancelled query) does not carry.
func stepError(ctx context.Context, name, doing string, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("lease: %s step %q: %w: %w", doing, name, cause, err)
	}
	return fmt.Errorf("lease: %s step %q: %w", doing, name, err)
}
