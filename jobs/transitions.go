package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

// ErrLeaseLost is returned for a completion whose fence no longer matches:
// the lease expired or was taken back, and a newer attempt (or the reaper)
// owns the job. Nothing but the attempt's own row was written.
var ErrLeaseLost = errors.New("jobs: lease lost")

// ErrNotReplayable is returned by Replay for a job that is not finished, or
// that SUCCEEDED (a success is never replayed by accident).
var ErrNotReplayable = errors.New("jobs: job cannot be replayed")

// CompletionOutcome is what a runner reports, in a Completion, when an
// attempt ends; it decides the job's next state. (AttemptOutcome is what
// is then recorded on the attempt's row.)
type CompletionOutcome string

// The outcomes a worker reports.
const (
	OutcomeSucceeded      CompletionOutcome = "succeeded"       // → SUCCEEDED with Result
	OutcomeReviewRequired CompletionOutcome = "review_required" // → REVIEW_REQUIRED with Result and Error as the reason
	OutcomeRetry          CompletionOutcome = "retry"           // → RETRY_SCHEDULED after RetryDelay, or FAILED_TERMINAL when attempts or time ran out
	OutcomeFailed         CompletionOutcome = "failed"          // → FAILED_TERMINAL (dead-lettered)
	OutcomeCancelled      CompletionOutcome = "cancelled"       // → CANCELLED, honouring a cancellation request
	OutcomeReleased       CompletionOutcome = "released"        // → RETRY_SCHEDULED at once: the worker is shutting down
	OutcomeSnoozed        CompletionOutcome = "snoozed"         // → RETRY_SCHEDULED after RetryDelay, the attempt not counted against MaxAttempts
)

// AttemptOutcome is how an attempt ended, as recorded on its row.
type AttemptOutcome string

// The attempt outcomes. An attempt still running has none.
const (
	AttemptSucceeded      AttemptOutcome = "succeeded"
	AttemptReviewRequired AttemptOutcome = "review_required"
	AttemptRetryScheduled AttemptOutcome = "retry_scheduled"
	AttemptFailed         AttemptOutcome = "failed"
	AttemptCancelled      AttemptOutcome = "cancelled"
	AttemptReleased       AttemptOutcome = "released"      // handed back at shutdown
	AttemptSnoozed        AttemptOutcome = "snoozed"       // put off by its handler (a limiter, a circuit breaker), or released unstarted after its claim's reply was lost; not counted against MaxAttempts
	AttemptLeaseExpired   AttemptOutcome = "lease_expired" // its worker stopped heartbeating; the reaper took the job back
	AttemptStale          AttemptOutcome = "stale"         // it completed after losing its lease; nothing of it was applied
	AttemptHung           AttemptOutcome = "hung"          // still running past its timeout and grace: its runner abandoned the lease (see MarkHung)
	AttemptReused         AttemptOutcome = "reused"        // succeeded with the result of the job it names (Attempt.ReusedFrom), its handler not called
)

// Error classes recorded on jobs and attempts. Handlers choose between the
// first three through the errors they return; the runner and the reaper set
// the others.
const (
	ClassTransient     = "transient"      // retried with backoff
	ClassPermanent     = "permanent"      // terminal at once
	ClassInvalidOutput = "invalid_output" // retried within a small budget, then review or failure
	ClassTimeout       = "timeout"        // the attempt timeout fired
	ClassPanic         = "panic"          // the handler panicked
	ClassDeadline      = "deadline"       // no time left before the job's deadline
	ClassLeaseExpired  = "lease_expired"  // the worker stopped heartbeating
	ClassCancelled     = "cancelled"      // cancelled on request
	ClassShutdown      = "shutdown"       // released by a worker shutting down
	ClassHandlerDefect = "handler_defect" // the handler broke its contract (a result that is not JSON): terminal at once
	ClassUnrecordable  = "unrecordable"   // PostgreSQL refused to store the outcome (a host trigger or constraint): terminal at once
	ClassHung          = "hung"           // the handler kept running past its timeout and grace; its lease was abandoned
)

// ClaimParams asks for up to Limit eligible jobs of one queue.
type ClaimParams struct {
	Queue string
	// Kinds are the kinds the worker can run; others are left for workers
	// that can. Required.
	Kinds []string
	// Worker identifies the lease holder (host, process, runner).
	Worker string
	// Limit is how many jobs to claim, 1 to MaxBatch.
	Limit int
	// LeaseDuration is how long the lease lasts without a heartbeat.
	LeaseDuration time.Duration
	// LowPriorityShare is the fraction of each tenant's claims reserved for
	// its least urgent class with eligible work, so a busy urgent class
	// cannot starve it: 0 (none) to 1.
	LowPriorityShare float64
}

// Lease identifies one claimed attempt: the job and the fence it was
// claimed with.
type Lease struct {
	JobID uuid.UUID
	Fence int64
}

// HeartbeatResult says, for each lease a heartbeat covered, whether it is
// still held and whether cancellation was requested.
type HeartbeatResult struct {
	Kept            map[uuid.UUID]bool // leases extended; any other was lost
	CancelRequested map[uuid.UUID]bool // kept leases whose job a client asked to cancel
}

// Usage is what a provider reported for an attempt.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Uncertain marks an attempt whose provider call may have been made and
	// billed without its answer reaching the worker (a timeout, a lost
	// connection).
	Uncertain bool `json:"uncertain"`
}

// Completion is one attempt's outcome, applied only under its fence.
type Completion struct {
	Lease
	Attempt int
	// Worker is the lease holder reporting the outcome.
	Worker  string
	Outcome CompletionOutcome
	// Result is the job's result (succeeded, review required): small, or a
	// reference to where the result lives.
	Result json.RawMessage
	// ErrorClass and Error explain a failure, a retry or a review.
	ErrorClass string
	Error      string
	// RetryDelay is when to try again (OutcomeRetry, OutcomeSnoozed),
	// already raised to any Retry-After the provider sent.
	RetryDelay time.Duration
	// DeadlineMargin is the time reserved for the next attempt: a retry that
	// would start later than DeadlineAt minus this margin is refused.
	DeadlineMargin time.Duration
	Usage          Usage
	// ReusedFrom, with OutcomeSucceeded, says that Result is the result of
	// that job, taken instead of calling the handler (Job.ReusedFrom of a
	// claimed job): the attempt is recorded as AttemptReused and names it.
	ReusedFrom uuid.UUID
	// Candidate and Model are the route candidate (lease.Route) that made
	// the attempt's last call and its model; Moves are the calls before it
	// that failed in a way the route moves on for, in the order they were
	// made. All three are empty for an attempt without a route. Candidate
	// and Model are at most MaxCandidateLen bytes without control
	// characters, and there are at most MaxMoves moves.
	Candidate string
	Model     string
	Moves     []Move
}

// Limits on what a Completion records of a route.
const (
	MaxCandidateLen = 200
	MaxMoves        = 16
	// MaxMoveErrorLen bounds a Move's Error as stored: Complete keeps its
	// first MaxMoveErrorLen bytes (whole UTF-8 characters) rather than
	// refusing a longer one.
	MaxMoveErrorLen = 1000
)

// Move is one provider call of an attempt that failed in a way its route
// moves on for (lease.Route), before the candidate that served the
// attempt: the candidate and model called, and why it failed. Failure is
// the reason class ("rate_limited", "server_error", "timeout",
// "unreachable", "context_window"), written by the runner; Error is the
// provider's message (made storable and cut to MaxMoveErrorLen bytes by
// Complete). InputTokens, OutputTokens and Uncertain are what the call
// reported or may have been billed, as in Usage.
type Move struct {
	Candidate    string `json:"candidate"`
	Model        string `json:"model"`
	Failure      string `json:"failure"`
	Error        string `json:"error,omitempty"`
	InputTokens  int64  `json:"input_tokens,omitempty"`
	OutputTokens int64  `json:"output_tokens,omitempty"`
	Uncertain    bool   `json:"uncertain,omitempty"`
}

// CompletionResult is what happened to one completion. When it applied, Err
// is nil and the other fields are the job's columns as the completion left
// them: every column it wrote but the result, and the ones others may have
// written while the attempt ran (a heartbeat's LeaseUntil, a cancel's
// CancelRequested and StateVersion). Err wraps ErrLeaseLost when the
// attempt's lease had ended and nothing changed.
//
// It does not carry the whole job: the payload and the result would cross
// the wire a second time for every completion, and a caller who completes
// a job already holds it as claimed. Apply gives the job as recorded.
type CompletionResult struct {
	JobID           uuid.UUID
	State           State
	StateVersion    int64
	Fence           int64
	MaxAttempts     int
	AvailableAt     time.Time
	FinishedAt      time.Time // zero unless State is terminal
	ErrorClass      string
	LastError       string
	ReusedFrom      uuid.UUID
	UpdatedAt       time.Time
	LeaseUntil      time.Time
	CancelRequested time.Time
	Err             error

	// keptResult is the job's result when the completion sent none.
	keptResult json.RawMessage
}

// Apply returns the job as the completion c recorded it, given claimed, the
// job as its attempt was claimed (Claim's or Leases' copy): a copy of
// claimed with the fields r carries and the result c sent, as c sent it
// (the store keeps it as jsonb, which spaces and orders it its own way),
// or, when c sent none, the one the job kept. It returns nil when r.Err is
// set. The copy's other fields are claimed's: a completion does not change
// them.
func (r CompletionResult) Apply(claimed *Job, c Completion) *Job {
	if r.Err != nil || claimed == nil {
		return nil
	}
	j := *claimed
	j.State, j.StateVersion, j.Fence, j.MaxAttempts = r.State, r.StateVersion, r.Fence, r.MaxAttempts
	j.AvailableAt, j.FinishedAt, j.UpdatedAt = r.AvailableAt, r.FinishedAt, r.UpdatedAt
	j.ErrorClass, j.LastError, j.ReusedFrom = r.ErrorClass, r.LastError, r.ReusedFrom
	j.LeaseUntil, j.CancelRequested = r.LeaseUntil, r.CancelRequested
	j.Result = r.keptResult
	if len(c.Result) > 0 {
		j.Result = c.Result
	}
	return &j
}

// Attempt is one attempt of a job, as recorded.
type Attempt struct {
	JobID      uuid.UUID      `json:"job_id"`
	Attempt    int            `json:"attempt"`
	Fence      int64          `json:"fence"`
	Worker     string         `json:"worker"`
	StartedAt  time.Time      `json:"started_at"`
	EndedAt    time.Time      `json:"ended_at,omitzero"`
	Outcome    AttemptOutcome `json:"outcome,omitempty"`
	ErrorClass string         `json:"error_class,omitempty"`
	Error      string         `json:"error,omitempty"`
	RetryAt    time.Time      `json:"retry_at,omitzero"`
	Usage      Usage          `json:"usage"`
	// ReusedFrom is the job whose result a reused attempt took.
	ReusedFrom uuid.UUID `json:"reused_from,omitzero"`
	// Candidate and Model are the route candidate that made the attempt's
	// last call and its model, and Moves the calls before it that moved
	// on (Completion.Moves); empty for an attempt without a route, and for
	// one that has not ended.
	Candidate string `json:"candidate,omitempty"`
	Model     string `json:"model,omitempty"`
	Moves     []Move `json:"moves,omitempty"`
}

// ReapParams bounds one pass of the reaper.
type ReapParams struct {
	// Limit is the most jobs one pass takes back. Default 1000.
	Limit int
	// Backoff is the default full-jitter policy for jobs taken back, and
	// BackoffByKind overrides it per kind.
	Backoff       llmqtype.BackoffPolicy
	BackoffByKind map[string]llmqtype.BackoffPolicy
	// DeadlineMargin is the time the next attempt needs; a job with less
	// than that left before its deadline fails instead of retrying.
	DeadlineMargin time.Duration
}

// ReapResult counts what one reaper pass did.
type ReapResult struct {
	Rescheduled  int // expired leases whose job will be retried
	LeaseFailed  int // expired leases whose job had no attempts or time left
	DeadlineFail int // waiting jobs whose deadline passed
}

// ReplayParams asks for a new run of a finished job.
type ReplayParams struct {
	Tenant string
	JobID  uuid.UUID
	// By and Reason record who asked for the replay, and why. Required.
	By     string
	Reason string
	// DeadlineAt is the new job's deadline; zero means none. The old job's
	// deadline is not copied: it has usually passed.
	DeadlineAt time.Time
	// Again asks for another new job even when JobID was replayed before.
	// Without it a replay is idempotent: a second replay of the same job
	// returns the first replay's job (ReplayResult.Existing) and writes
	// nothing, so a repeated request never pays twice.
	Again bool
}

// ReplayResult is what Replay did.
type ReplayResult struct {
	// Job is the replay: the new job, or the job of the earlier replay.
	Job *Job
	// Existing is true when JobID had been replayed before (and Again was
	// not set): nothing was written and Job is that first replay.
	Existing bool
}

// HungAttempt is an attempt its runner gives up on: the handler still runs
// past its timeout and grace. See MarkHung.
type HungAttempt struct {
	Lease
	// Error says what happened, for the attempt's row.
	Error string
}

func (s *PostgresStore) checkClaim(p ClaimParams) error {
	switch {
	case !s.queues[p.Queue]:
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Queue", Problem: fmt.Sprintf("%q is not one of the configured queues %q", p.Queue, s.cfg.Queues), Cause: ErrUnknownQueue}
	case len(p.Kinds) == 0:
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Kinds", Problem: "must name at least one kind"}
	case p.Worker == "":
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Worker", Problem: "must not be empty"}
	case p.Limit < 1 || p.Limit > MaxBatch:
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "Limit", Problem: fmt.Sprintf("is %d; use 1 to %d", p.Limit, MaxBatch)}
	case p.LeaseDuration < time.Second:
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "LeaseDuration", Problem: fmt.Sprintf("is %s; use at least 1s", p.LeaseDuration)}
	case p.LowPriorityShare < 0 || p.LowPriorityShare > 1:
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "LowPriorityShare", Problem: fmt.Sprintf("is %g; use 0 to 1", p.LowPriorityShare)}
	}
	return nil
}

// Heartbeat implements Store: it extends, in one statement, every lease in
// leases that worker still holds.
func (s *PostgresStore) Heartbeat(ctx context.Context, db DBTX, worker string, leaseDuration time.Duration, leases []Lease) (HeartbeatResult, error) {
	res := HeartbeatResult{Kept: map[uuid.UUID]bool{}, CancelRequested: map[uuid.UUID]bool{}}
	if len(leases) == 0 {
		return res, nil
	}
	ids := make([]pgtype.UUID, len(leases))
	fences := make([]int64, len(leases))
	for i, l := range lockOrder(leases, func(l Lease) uuid.UUID { return l.JobID }) {
		ids[i], fences[i] = dbsql.UUID(l.JobID), l.Fence
	}
	type kept struct {
		id     [16]byte
		cancel bool
	}
	leased, err := dbsql.CollectUnder(ctx, db, s.sql.keyedPlans, s.sql.restorePlans, s.sql.heartbeat,
		[]any{worker, leaseDuration.Milliseconds(), ids, fences},
		func(row pgx.CollectableRow) (kept, error) {
			var k kept
			err := row.Scan(&k.id, &k.cancel)
			return k, err
		})
	if err != nil {
		return res, fmt.Errorf("jobs: heartbeat: %w", err)
	}
	for _, k := range leased {
		res.Kept[k.id] = true
		if k.cancel {
			res.CancelRequested[k.id] = true
		}
	}
	return res, nil
}

// lockOrder returns a copy of items sorted by job id. Every statement that
// updates several jobs a runner holds (a heartbeat, a batch of
// completions, stale and hung attempts) gets its jobs in this order. The
// statements lock rows in the order they are given, or in the primary
// key's (which is the same), so a runner's heartbeat and its completions,
// which run at once on the same rows, take their row locks in one order
// and cannot deadlock.
func lockOrder[T any](items []T, id func(T) uuid.UUID) []T {
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b T) int {
		ia, ib := id(a), id(b)
		return bytes.Compare(ia[:], ib[:])
	})
	return sorted
}

// Leases implements Store.
func (s *PostgresStore) Leases(ctx context.Context, db DBTX, worker, queue string) ([]*Job, error) {
	if worker == "" {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "worker", Problem: "must not be empty"}
	}
	if queue == "" {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "queue", Problem: "must not be empty"}
	}
	rows, err := db.Query(ctx, s.sql.leases, worker, queue)
	if err != nil {
		return nil, fmt.Errorf("jobs: leases of %s in %s: %w", worker, queue, err)
	}
	held, err := pgx.CollectRows(rows, scanJobs())
	if err != nil {
		return nil, fmt.Errorf("jobs: leases of %s in %s: %w", worker, queue, err)
	}
	return held, nil
}

// Complete implements Store: it applies a batch of completions in one
// statement, each only under its own fence, with the attempt rows and the
// outbox events of terminal transitions. Results are in input order. Run it
// in a transaction to add writes of your own to the same commit.
func (s *PostgresStore) Complete(ctx context.Context, db DBTX, completions []Completion) ([]CompletionResult, error) {
	n := len(completions)
	if n == 0 {
		return nil, nil
	}
	var (
		ids, eventIDs              = make([]pgtype.UUID, n), make([]pgtype.UUID, n)
		fences, delays, margins    = make([]int64, n), make([]int64, n), make([]int64, n)
		inTokens, outTokens        = make([]int64, n), make([]int64, n)
		outcomes                   = make([]string, n)
		classes, messages, results = make([]*string, n), make([]*string, n), make([]*string, n)
		uncertain                  = make([]bool, n)
		reusedFrom                 = make([]pgtype.UUID, n)
		candidates, models, moves  = make([]*string, n), make([]*string, n), make([]*string, n)
		seen                       = make(map[uuid.UUID]bool, n)
	)
	for i, c := range completions {
		if err := c.Validate(); err != nil {
			var fe *llmqtype.ValidationError
			if errors.As(err, &fe) {
				fe.Field = fmt.Sprintf("completions[%d].%s", i, fe.Field)
			}
			return nil, err
		}
		if seen[c.JobID] {
			return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: fmt.Sprintf("completions[%d].JobID", i), Problem: "appears twice in one batch"}
		}
		seen[c.JobID] = true
	}
	for i, c := range lockOrder(completions, func(c Completion) uuid.UUID { return c.JobID }) {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("jobs: new event id: %w", err)
		}
		ids[i], eventIDs[i], fences[i], outcomes[i] = dbsql.UUID(c.JobID), dbsql.UUID(id), c.Fence, string(c.Outcome)
		classes[i], messages[i] = dbsql.NullIfZero(c.ErrorClass), dbsql.NullIfZero(validate.MakeStorable(c.Error))
		if len(c.Result) > 0 {
			results[i] = dbsql.NullIfZero(string(c.Result))
		}
		delays[i], margins[i] = c.RetryDelay.Milliseconds(), c.DeadlineMargin.Milliseconds()
		inTokens[i], outTokens[i], uncertain[i] = c.Usage.InputTokens, c.Usage.OutputTokens, c.Usage.Uncertain
		if c.ReusedFrom != uuid.Nil {
			reusedFrom[i] = dbsql.UUID(c.ReusedFrom)
		}
		candidates[i], models[i] = dbsql.NullIfZero(c.Candidate), dbsql.NullIfZero(c.Model)
		if moves[i], err = movesJSON(c.Moves); err != nil {
			return nil, err
		}
	}
	applied, err := dbsql.CollectUnder(ctx, db, s.sql.keyedPlans, s.sql.restorePlans, s.sql.complete,
		[]any{ids, fences, outcomes, results, classes,
			messages, delays, margins, uncertain, inTokens,
			outTokens, eventIDs, s.cfg.EventTopic, reusedFrom, candidates,
			models, moves},
		scanCompleted())
	if err != nil {
		return nil, fmt.Errorf("jobs: complete: %w", err)
	}
	byID := make(map[uuid.UUID]int, len(applied))
	for i, r := range applied {
		byID[r.JobID] = i
	}
	out := make([]CompletionResult, n)
	var stale []Completion
	for i, c := range completions {
		if k, ok := byID[c.JobID]; ok {
			out[i] = applied[k]
			continue
		}
		out[i] = CompletionResult{Err: fmt.Errorf("%w: job %s, attempt %d (fence %d)", ErrLeaseLost, c.JobID, c.Attempt, c.Fence)}
		stale = append(stale, c)
	}
	if len(stale) > 0 {
		if err := s.markStale(ctx, db, stale); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// markStale records completions that lost their lease on their own attempt
// rows, and nowhere else.
func (s *PostgresStore) markStale(ctx context.Context, db DBTX, stale []Completion) error {
	n := len(stale)
	ids, attempts, fences := make([]pgtype.UUID, n), make([]int32, n), make([]int64, n)
	workers, outcomes := make([]string, n), make([]string, n)
	inTokens, outTokens, uncertain := make([]int64, n), make([]int64, n), make([]bool, n)
	for i, c := range lockOrder(stale, func(c Completion) uuid.UUID { return c.JobID }) {
		// Validate bounded the attempt number.
		ids[i], attempts[i], fences[i] = dbsql.UUID(c.JobID), int32(c.Attempt), c.Fence
		workers[i], outcomes[i] = c.Worker, string(c.Outcome)
		inTokens[i], outTokens[i], uncertain[i] = c.Usage.InputTokens, c.Usage.OutputTokens, c.Usage.Uncertain
	}
	if _, err := db.Exec(ctx, s.sql.markStale, ids, attempts, fences, workers, outcomes, inTokens, outTokens, uncertain); err != nil {
		return fmt.Errorf("jobs: recording stale completions: %w", err)
	}
	return nil
}

// Validate reports, as a *llmqtype.ValidationError, what in c the store would
// refuse: an unknown outcome, an attempt number out of range, no worker, a
// negative duration, or a Result that is not JSON PostgreSQL's jsonb can
// hold. Complete refuses a batch holding such a completion before writing
// anything; a runner validates each outcome before it joins a batch, so
// that one bad outcome cannot fail the others. What it records of a route
// is refused when a Candidate or Model is empty where required, longer
// than MaxCandidateLen or holds a control character, when Model is set
// without Candidate, when there are more than MaxMoves moves, or when a
// move has no Candidate or Failure. Error texts are never refused:
// Complete replaces what PostgreSQL cannot store in them (invalid UTF-8,
// NUL bytes), and cuts a move's Error to MaxMoveErrorLen bytes.
func (c Completion) Validate() error {
	fail := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	switch c.Outcome {
	case OutcomeSucceeded, OutcomeReviewRequired, OutcomeRetry, OutcomeFailed, OutcomeCancelled, OutcomeReleased, OutcomeSnoozed:
	default:
		return fail("Outcome", fmt.Sprintf("%q is not an outcome", c.Outcome))
	}
	if c.Attempt < 1 || c.Attempt > 1<<30 {
		return fail("Attempt", fmt.Sprintf("is %d; attempts start at 1", c.Attempt))
	}
	if c.Worker == "" {
		return fail("Worker", "must not be empty")
	}
	if len(c.Result) > 0 {
		if problem, _ := validate.JSON(c.Result, math.MaxInt); problem != "" {
			return fail("Result", problem)
		}
	}
	if c.RetryDelay < 0 || c.DeadlineMargin < 0 {
		return fail("RetryDelay", "durations must not be negative")
	}
	if c.ReusedFrom != uuid.Nil && c.Outcome != OutcomeSucceeded {
		return fail("ReusedFrom", fmt.Sprintf("is set with outcome %q; a reused result is a success", c.Outcome))
	}
	return c.validateRoute(fail)
}

// validateRoute checks what c records of a route: its candidate and model
// and each move's names, as identifiers are checked elsewhere. A move's
// Error is never refused (see Complete).
func (c Completion) validateRoute(fail func(field, problem string) error) error {
	if problem := checkText(c.Candidate, false, MaxCandidateLen); problem != "" {
		return fail("Candidate", problem)
	}
	if problem := checkText(c.Model, false, MaxCandidateLen); problem != "" {
		return fail("Model", problem)
	}
	if c.Model != "" && c.Candidate == "" {
		return fail("Model", "is set without Candidate; a model is recorded with the candidate that called it")
	}
	if len(c.Moves) > MaxMoves {
		return fail("Moves", fmt.Sprintf("has %d moves, more than the limit of %d", len(c.Moves), MaxMoves))
	}
	for i, m := range c.Moves {
		field := func(name string) string { return fmt.Sprintf("Moves[%d].%s", i, name) }
		if problem := checkText(m.Candidate, true, MaxCandidateLen); problem != "" {
			return fail(field("Candidate"), problem)
		}
		if problem := checkText(m.Model, false, MaxCandidateLen); problem != "" {
			return fail(field("Model"), problem)
		}
		if problem := checkText(m.Failure, true, MaxCandidateLen); problem != "" {
			return fail(field("Failure"), problem)
		}
		if m.InputTokens < 0 {
			return fail(field("InputTokens"), fmt.Sprintf("is %d; must not be negative", m.InputTokens))
		}
		if m.OutputTokens < 0 {
			return fail(field("OutputTokens"), fmt.Sprintf("is %d; must not be negative", m.OutputTokens))
		}
	}
	return nil
}

// movesJSON is moves as Complete stores them: a JSON array, each Error
// made storable and cut to MaxMoveErrorLen bytes; nil (NULL) for none.
func movesJSON(moves []Move) (*string, error) {
	if len(moves) == 0 {
		return nil, nil
	}
	stored := make([]Move, len(moves))
	for i, m := range moves {
		m.Error = cutText(validate.MakeStorable(m.Error), MaxMoveErrorLen)
		stored[i] = m
	}
	b, err := json.Marshal(stored)
	if err != nil {
		return nil, fmt.Errorf("jobs: encoding moves: %w", err)
	}
	text := string(b)
	return &text, nil
}

// cutText returns the longest prefix of s, valid UTF-8, of at most n bytes
// that ends at a character's boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// OutputAsResult returns a model's or handler's output in a form the store
// can keep as a job's result: output itself when it is JSON that
// PostgreSQL's jsonb accepts, else a JSON string holding output as text
// (invalid UTF-8 and NUL bytes become U+FFFD), so whoever reviews the job
// reads what was said. Empty output stays empty.
func OutputAsResult(output []byte) json.RawMessage {
	if len(output) == 0 {
		return nil
	}
	if problem, _ := validate.JSON(output, math.MaxInt); problem == "" {
		return json.RawMessage(output)
	}
	text, err := json.Marshal(validate.MakeStorable(string(output)))
	if err != nil { // a string always marshals
		return nil
	}
	return text
}

// Reap implements Store: one pass of the reaper. Expired leases are taken
// back (fence+1) and rescheduled with backoff or failed; waiting jobs past
// their deadline fail with class "deadline". Safe to run from every runner
// at once: each pass skips rows another holds.
func (s *PostgresStore) Reap(ctx context.Context, db DBTX, p ReapParams) (ReapResult, error) {
	limit := p.Limit
	if limit == 0 {
		limit = 1000
	}
	def := p.Backoff.WithDefaults()
	base, ceiling := def.Base.Milliseconds(), def.Cap.Milliseconds()
	kinds := make([]string, 0, len(p.BackoffByKind))
	bases := make([]int64, 0, len(p.BackoffByKind))
	caps := make([]int64, 0, len(p.BackoffByKind))
	for kind, policy := range p.BackoffByKind {
		policy = policy.WithDefaults()
		kinds = append(kinds, kind)
		bases = append(bases, policy.Base.Milliseconds())
		caps = append(caps, policy.Cap.Milliseconds())
	}
	var res ReapResult
	err := db.QueryRow(ctx, s.sql.reap, limit, base, ceiling, kinds, bases, caps, p.DeadlineMargin.Milliseconds(), s.cfg.EventTopic).
		Scan(&res.Rescheduled, &res.LeaseFailed)
	if err != nil {
		return res, fmt.Errorf("jobs: reaping expired leases: %w", err)
	}
	if err := db.QueryRow(ctx, s.sql.failDeadlines, limit, s.cfg.EventTopic).Scan(&res.DeadlineFail); err != nil {
		return res, fmt.Errorf("jobs: failing expired deadlines: %w", err)
	}
	return res, nil
}

// MoveParams moves a job its worker holds to another queue (Move).
type MoveParams struct {
	Lease
	// Worker is the lease holder, recorded as the attempt's worker.
	Worker string
	// Queue is where the job goes: one of the store's Config.Queues.
	Queue string
	// Reason says why, for the attempt's row. Required.
	Reason string
}

// Move ends a running job's lease under its fence and puts it in another
// queue, runnable at once, for another kind of worker to serve: a
// provider batch submitter hands a job whose deadline no longer leaves
// room for a batch to a queue of synchronous runners. The attempt is
// recorded as snoozed with Reason as its error and, as a snooze, is not
// counted against MaxAttempts. It writes no lifecycle event and NOTIFYs
// the new queue. ErrLeaseLost if the job is no longer in that lease.
func (s *PostgresStore) Move(ctx context.Context, db DBTX, p MoveParams) (*Job, error) {
	fail := func(field, problem string, cause error) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem, Cause: cause}
	}
	switch {
	case !s.queues[p.Queue]:
		return nil, fail("Queue", fmt.Sprintf("%q is not one of the configured queues %q", p.Queue, s.cfg.Queues), ErrUnknownQueue)
	case p.Worker == "":
		return nil, fail("Worker", "must not be empty", nil)
	case p.Reason == "":
		return nil, fail("Reason", "must not be empty", nil)
	}
	rows, err := db.Query(ctx, s.sql.move, dbsql.UUID(p.JobID), p.Fence, p.Queue, p.Worker, validate.MakeStorable(p.Reason), s.channel)
	if err != nil {
		return nil, fmt.Errorf("jobs: move: %w", err)
	}
	job, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: job %s (fence %d)", ErrLeaseLost, p.JobID, p.Fence)
	}
	if err != nil {
		return nil, fmt.Errorf("jobs: move: %w", err)
	}
	return job, nil
}

// Replay implements Store: a new job with the finished job's input, linked
// by ReplayOf and recording who asked and why. The finished job is not
// changed. SUCCEEDED jobs and live jobs return ErrNotReplayable.
//
// A replay is idempotent per finished job: the first replay of a job takes
// a replay key (a job_keys row of the tenant holding a key no tenant can
// send, since keys with control characters are refused), and a second
// replay finds it and returns that job with Existing set, writing nothing.
// ReplayParams.Again skips the key and always creates a new job.
func (s *PostgresStore) Replay(ctx context.Context, db DBTX, p ReplayParams) (ReplayResult, error) {
	fail := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem}
	}
	if problem := checkText(p.By, true, MaxTenantLen); problem != "" {
		return ReplayResult{}, fail("By", problem)
	}
	if problem := checkText(p.Reason, true, 1000); problem != "" {
		return ReplayResult{}, fail("Reason", problem)
	}
	if !p.DeadlineAt.IsZero() && !p.DeadlineAt.After(time.Now()) {
		return ReplayResult{}, fail("DeadlineAt", "is not in the future")
	}
	id, err := uuid.NewV7()
	if err != nil {
		return ReplayResult{}, fmt.Errorf("jobs: new job id: %w", err)
	}
	eventID, err := uuid.NewV7()
	if err != nil {
		return ReplayResult{}, fmt.Errorf("jobs: new event id: %w", err)
	}
	channel := s.channel // replays are rare: always worth a wake-up
	if s.cfg.DisableNotify {
		channel = ""
	}
	var key *string
	if !p.Again {
		k := replayKey(p.JobID)
		key = &k
	}
	rows, err := db.Query(ctx, s.sql.replay, p.Tenant, p.JobID, id, dbsql.NullIfZero(p.DeadlineAt), p.By, p.Reason, eventID, s.cfg.EventTopic, channel, key, s.cfg.KindsWithoutEvents)
	if err != nil {
		return ReplayResult{}, fmt.Errorf("jobs: replay %s: %w", p.JobID, err)
	}
	job, err := pgx.CollectExactlyOneRow(rows, scanJob)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s.replayRefused(ctx, db, p, key)
	case err != nil:
		return ReplayResult{}, fmt.Errorf("jobs: replay %s: %w", p.JobID, err)
	}
	return ReplayResult{Job: job}, nil
}

// replayKey is the key of the first replay of a job. Its control character
// keeps it out of reach of every tenant's own keys.
func replayKey(id uuid.UUID) string { return "\x1freplay " + id.String() }

// replayRefused explains a replay that wrote nothing: the job was replayed
// before (its first replay is returned), it is not finished, or it does not
// exist for the tenant.
func (s *PostgresStore) replayRefused(ctx context.Context, db DBTX, p ReplayParams, key *string) (ReplayResult, error) {
	if key != nil {
		rows, err := db.Query(ctx, s.sql.selectByKey, []string{p.Tenant}, []string{*key})
		if err != nil {
			return ReplayResult{}, fmt.Errorf("jobs: replay %s: reading its earlier replay: %w", p.JobID, err)
		}
		earlier, err := pgx.CollectRows(rows, scanJobs())
		if err != nil {
			return ReplayResult{}, fmt.Errorf("jobs: replay %s: reading its earlier replay: %w", p.JobID, err)
		}
		if len(earlier) == 1 && earlier[0].ReplayOf == p.JobID {
			return ReplayResult{Job: earlier[0], Existing: true}, nil
		}
	}
	old, err := s.Get(ctx, db, p.Tenant, p.JobID)
	if err != nil {
		return ReplayResult{}, err
	}
	return ReplayResult{}, fmt.Errorf("%w: %s is %s", ErrNotReplayable, p.JobID, old.State)
}

// MarkHung implements Store: for each attempt still RUNNING under its fence
// and held by worker, it moves the fence on, so that nothing the hung
// handler reports later can apply (it is recorded as stale), and writes
// the attempt's row as hung and uncertain. The job stays RUNNING and its
// lease is left to run out: nobody renews it, and once it has expired the
// reaper takes the job back like any other, recording the class "hung". It
// returns the leases it marked, with their new fences.
func (s *PostgresStore) MarkHung(ctx context.Context, db DBTX, worker string, hung []HungAttempt) ([]Lease, error) {
	if len(hung) == 0 {
		return nil, nil
	}
	if worker == "" {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: "worker", Problem: "must not be empty"}
	}
	ids := make([]pgtype.UUID, len(hung))
	fences := make([]int64, len(hung))
	messages := make([]string, len(hung))
	for i, h := range lockOrder(hung, func(h HungAttempt) uuid.UUID { return h.JobID }) {
		ids[i], fences[i], messages[i] = dbsql.UUID(h.JobID), h.Fence, validate.MakeStorable(h.Error)
	}
	marked, err := dbsql.CollectUnder(ctx, db, s.sql.keyedPlans, s.sql.restorePlans, s.sql.markHung,
		[]any{worker, ids, fences, messages},
		func(row pgx.CollectableRow) (Lease, error) {
			var l Lease
			err := row.Scan((*[16]byte)(&l.JobID), &l.Fence)
			return l, err
		})
	if err != nil {
		return nil, fmt.Errorf("jobs: marking hung attempts: %w", err)
	}
	return marked, nil
}

// Attempts implements Store: the tenant's job's attempts, oldest first.
func (s *PostgresStore) Attempts(ctx context.Context, db DBTX, tenant string, id uuid.UUID) ([]Attempt, error) {
	rows, err := db.Query(ctx, s.sql.attempts, tenant, id)
	if err != nil {
		return nil, fmt.Errorf("jobs: attempts of %s: %w", id, s.explain(err))
	}
	attempts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var r attemptRow
		if err := row.Scan(r.dest()...); err != nil {
			return Attempt{}, err
		}
		return r.attempt()
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: attempts of %s: %w", id, s.explain(err))
	}
	if len(attempts) == 0 {
		if _, err := s.Get(ctx, db, tenant, id); err != nil {
			return nil, err
		}
	}
	return attempts, nil
}
