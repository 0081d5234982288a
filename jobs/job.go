package jobs

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// State is where a job is in its life. READY, RUNNING and RETRY_SCHEDULED
// are live; the other four are terminal and never change again.
type State string

// The job states. A job starts READY (or READY with a future AvailableAt).
const (
	StateReady          State = "READY"           // eligible from AvailableAt on
	StateRunning        State = "RUNNING"         // leased by a worker until LeaseUntil
	StateRetryScheduled State = "RETRY_SCHEDULED" // waiting for AvailableAt before its next attempt
	StateSucceeded      State = "SUCCEEDED"       // terminal: the result is accepted
	StateReviewRequired State = "REVIEW_REQUIRED" // terminal: a result a person must look at; never delivered onward as success
	StateFailedTerminal State = "FAILED_TERMINAL" // terminal: dead-lettered
	StateCancelled      State = "CANCELLED"       // terminal: cancelled before it finished
)

// States lists every state in lifecycle order.
func States() []State {
	return []State{StateReady, StateRunning, StateRetryScheduled,
		StateSucceeded, StateReviewRequired, StateFailedTerminal, StateCancelled}
}

// Terminal reports whether s is final.
func (s State) Terminal() bool {
	switch s {
	case StateSucceeded, StateReviewRequired, StateFailedTerminal, StateCancelled:
		return true
	}
	return false
}

// Valid reports whether s is one of the seven states.
func (s State) Valid() bool {
	switch s {
	case StateReady, StateRunning, StateRetryScheduled,
		StateSucceeded, StateReviewRequired, StateFailedTerminal, StateCancelled:
		return true
	}
	return false
}

// Job is a job row as the store sees it. Optional columns that are NULL in
// the database read as Go zero values (an empty string, a zero time).
type Job struct {
	ID              uuid.UUID       `json:"id"`
	Tenant          string          `json:"tenant"`
	Kind            string          `json:"kind"`
	Queue           string          `json:"queue"`
	Priority        int             `json:"priority"`
	IdempotencyKey  string          `json:"idempotency_key,omitempty"`
	RequestHash     string          `json:"request_hash,omitempty"`
	Payload         json.RawMessage `json:"payload"`
	GroupKey        string          `json:"group_key,omitempty"`
	State           State           `json:"state"`
	Attempt         int             `json:"attempt"`
	MaxAttempts     int             `json:"max_attempts"`
	Fence           int64           `json:"fence"`
	LeaseOwner      string          `json:"lease_owner,omitempty"` // the current or last lease holder
	LeaseUntil      time.Time       `json:"lease_until,omitzero"`
	AttemptedAt     time.Time       `json:"attempted_at,omitzero"` // when the current or last attempt was claimed
	AvailableAt     time.Time       `json:"available_at"`
	DeadlineAt      time.Time       `json:"deadline_at,omitzero"`
	StateVersion    int64           `json:"state_version"`
	EstimatedTokens int64           `json:"estimated_tokens"`
	Result          json.RawMessage `json:"result,omitempty"`
	ErrorClass      string          `json:"error_class,omitempty"`
	LastError       string          `json:"last_error,omitempty"`
	ReplayOf        uuid.UUID       `json:"replay_of,omitzero"`
	ReplayedBy      string          `json:"replayed_by,omitempty"`
	ReplayReason    string          `json:"replay_reason,omitempty"`
	CancelRequested time.Time       `json:"cancel_requested_at,omitzero"`
	CreatedAt       time.Time       `json:"created_at"`
	UpdatedAt       time.Time       `json:"updated_at"`
	FinishedAt      time.Time       `json:"finished_at,omitzero"`
	// TraceParent is the W3C traceparent of the span that accepted the job
	// (empty outside a trace): each attempt's span continues that trace.
	TraceParent string `json:"trace_parent,omitempty"`
	// BatchID is the batch the job was accepted in (EnqueueBatch), or zero.
	BatchID uuid.UUID `json:"batch_id,omitzero"`
	// Reuse is the job's reuse key, scope and TTL (EnqueueParams.Reuse),
	// or nil.
	Reuse *Reuse `json:"reuse,omitempty"`
	// ReusedFrom is the SUCCEEDED job whose result this job took instead
	// of calling its handler, or zero. On a job a claim returned, it is the
	// job whose result the attempt is to take, and Result holds that
	// result (the runner records it with Completion.ReusedFrom).
	ReusedFrom uuid.UUID `json:"reused_from,omitzero"`
}

// EnqueueParams describes a job to accept. Tenant and Kind are required;
// every other zero value means a documented default.
type EnqueueParams struct {
	// Tenant owns the job; every read is scoped to it. Required, at most
	// MaxTenantLen bytes. Take it from the caller's credential, never from a
	// request body.
	Tenant string
	// Kind names the handler that runs the job, such as "invoice.extract".
	// Required: letters, digits, '.', '_' and '-', at most MaxKindLen bytes.
	Kind string
	// Queue isolates kinds of work. It must be one of Config.Queues.
	// Default "default".
	Queue string
	// Priority is the job's class within its queue, 0 (most urgent, the
	// default) to MaxPriority.
	Priority int
	// Payload is the job's input as JSON: ids and options, not documents.
	// At most Config.MaxPayloadBytes. Empty means {}.
	Payload json.RawMessage
	// IdempotencyKey makes acceptance idempotent per tenant: a second
	// enqueue with the same key and request hash returns the first job. At
	// most MaxIdempotencyKeyLen bytes. Empty means no deduplication.
	IdempotencyKey string
	// RequestHash identifies what the job computes; the same key with a
	// different hash is ErrIdempotencyConflict. Build it with RequestHash
	// from everything that changes the result. Empty, when a key is set,
	// means the hash of Kind and Payload.
	RequestHash string
	// GroupKey serialises jobs: at most one job per (tenant, group key) runs
	// at a time, in acceptance order. Optional.
	GroupKey string
	// MaxAttempts bounds the attempts, 1 to MaxMaxAttempts. Zero means
	// Config.DefaultMaxAttempts.
	MaxAttempts int
	// AvailableAt delays the first attempt. Zero means now (the database's
	// clock).
	AvailableAt time.Time
	// DeadlineAt is when the job stops being worth running; no attempt
	// starts after it. Zero means no deadline; a time in the past is refused.
	DeadlineAt time.Time
	// EstimatedTokens is the expected model usage, for quotas and admission.
	EstimatedTokens int64
	// Reuse, when set, lets the job take an answer already paid for: the
	// result of a SUCCEEDED job of its kind with the same key, in scope
	// and young enough, instead of calling its handler; and it never runs
	// at the same time as another job with its key (see Reuse). Nil, the
	// default, always computes.
	Reuse *Reuse
}

// EnqueueResult is the outcome of one accepted job.
type EnqueueResult struct {
	// Job is the job as stored: the new one, or the one accepted earlier
	// under the same idempotency key (in whatever state it has reached).
	Job *Job
	// Existing is true when the key was already taken with the same request
	// hash: nothing was written and Job is the earlier job.
	Existing bool
}

// ListParams selects a tenant's jobs, newest first.
type ListParams struct {
	// Tenant whose jobs to list. Required.
	Tenant string
	// States filters by state; empty means all.
	States []State
	// Kind filters by kind; empty means all.
	Kind string
	// Cursor continues a previous page (ListResult.NextCursor).
	Cursor string
	// Limit is the page size, 1 to MaxListLimit. Default 100.
	Limit int
}

// ListResult is one page of jobs.
type ListResult struct {
	Jobs []*Job
	// NextCursor fetches the next page; empty on the last one.
	NextCursor string
}

// QueueStats summarises one queue.
type QueueStats struct {
	Queue string `json:"queue"`
	// Counts holds the number of jobs in each state that has any: every
	// waiting and running job, and the jobs that finished within
	// StatsWindow (not the whole history).
	Counts map[State]int64 `json:"counts"`
	// OldestEligibleAge is how long the longest-waiting job that could run
	// now has been eligible; zero when none is waiting.
	OldestEligibleAge time.Duration `json:"oldest_eligible_age"`
}
