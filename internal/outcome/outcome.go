// Package outcome turns what a job's code returned (a result, or an error
// built with the jobs package's helpers) into the completion a runner
// records. The lease runner and the provider batch submitter share it, so a
// kind's result parser decides the same outcome on either path.
package outcome

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// Policy is how a runner decides: its retry backoff per kind, its
// invalid-output budget and what happens when that is spent.
type Policy struct {
	// Worker is the lease holder reporting the outcome.
	Worker string
	// DeadlineMargin is the time reserved for the next attempt.
	DeadlineMargin time.Duration
	// Backoff returns the retry policy of a kind.
	Backoff func(kind string) llmqtype.BackoffPolicy
	// InvalidOutputAttempts is how many attempts may end in invalid output
	// before FailInvalidOutput decides.
	InvalidOutputAttempts int
	// FailInvalidOutput fails a job whose invalid-output budget is spent;
	// otherwise it requires review.
	FailInvalidOutput bool
}

// Base is the completion of job's current attempt with no outcome yet.
func (p Policy) Base(job *jobs.Job) jobs.Completion {
	return jobs.Completion{
		Lease:          jobs.Lease{JobID: job.ID, Fence: job.Fence},
		Attempt:        job.Attempt,
		Worker:         p.Worker,
		DeadlineMargin: p.DeadlineMargin,
	}
}

// Retry is c retried with class after the kind's backoff, raised to
// retryAfter.
func (p Policy) Retry(job *jobs.Job, c jobs.Completion, class string, retryAfter time.Duration) jobs.Completion {
	c.Outcome, c.ErrorClass = jobs.OutcomeRetry, class
	c.RetryDelay = p.Backoff(job.Kind).Next(job.Attempt, retryAfter, nil)
	return c
}

// Decide turns a result and an error into the completion to record:
// success, a snooze, review, invalid output within or past its budget,
// and otherwise the error's class (jobs.Classify). invalidBefore is how
// many of the job's earlier attempts ended in invalid output.
func (p Policy) Decide(job *jobs.Job, result json.RawMessage, err error, invalidBefore int) jobs.Completion {
	if err == nil {
		return p.Succeeded(job, result)
	}
	c := p.Base(job)
	c.Error = err.Error()
	var (
		review  *jobs.ReviewError
		invalid *jobs.InvalidOutputError
		snooze  *jobs.SnoozeError
	)
	switch {
	case errors.As(err, &snooze):
		c.Outcome, c.RetryDelay = jobs.OutcomeSnoozed, snooze.After
		return c
	case errors.As(err, &review):
		c.Outcome, c.Result, c.ErrorClass, c.Error = jobs.OutcomeReviewRequired, jobs.OutputAsResult(review.Result), "", review.Reason
		return c
	case errors.As(err, &invalid):
		if invalidBefore+1 < p.InvalidOutputAttempts {
			return p.Retry(job, c, jobs.ClassInvalidOutput, 0)
		}
		// The output is kept either way, as text when it is not JSON, so
		// that whoever looks into the job reads what the model said.
		c.ErrorClass, c.Result = jobs.ClassInvalidOutput, jobs.OutputAsResult(invalid.Output)
		c.Outcome = jobs.OutcomeReviewRequired
		if p.FailInvalidOutput {
			c.Outcome = jobs.OutcomeFailed
		}
		return c
	}
	class, retryAfter := jobs.Classify(err)
	if class == jobs.ClassPermanent || class == jobs.ClassMalformedPayload {
		c.Outcome, c.ErrorClass = jobs.OutcomeFailed, class
		return c
	}
	return p.Retry(job, c, class, retryAfter)
}

// Succeeded is the completion of an attempt that returned result without
// an error.
func (p Policy) Succeeded(job *jobs.Job, result json.RawMessage) jobs.Completion {
	c := p.Base(job)
	c.Outcome, c.Result = jobs.OutcomeSucceeded, result
	return c
}

// Unrecordable is the failure recorded in place of an outcome PostgreSQL
// refused: the job fails alone, with class jobs.ClassUnrecordable.
func Unrecordable(c jobs.Completion, err error) jobs.Completion {
	return jobs.Completion{
		Lease: c.Lease, Attempt: c.Attempt, Worker: c.Worker, DeadlineMargin: c.DeadlineMargin, Usage: c.Usage,
		Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassUnrecordable,
		Error: fmt.Sprintf("PostgreSQL refused to record the attempt's outcome (%s): %v", c.Outcome, err),
	}
}

// Defective replaces an outcome the store would refuse (problem, from
// Completion.Validate) with what it stands for: the job's code broke its
// contract, and the job fails at once with class jobs.ClassHandlerDefect
// (retrying would pay the provider again for the same defect). A result
// that is not JSON the store can keep is kept as text, for whoever looks
// into the job.
func Defective(c jobs.Completion, result json.RawMessage, problem error) jobs.Completion {
	d := jobs.Completion{
		Lease: c.Lease, Attempt: c.Attempt, Worker: c.Worker, DeadlineMargin: c.DeadlineMargin,
		Outcome: jobs.OutcomeFailed, ErrorClass: jobs.ClassHandlerDefect,
	}
	if c.Outcome == jobs.OutcomeSucceeded {
		d.Result = jobs.OutputAsResult(result)
		d.Error = fmt.Sprintf("the handler returned a result (%d bytes) that is not JSON the store can keep (%v); the job's result holds it as text", len(result), problem)
		return d
	}
	d.Error = fmt.Sprintf("the handler's outcome (%s) cannot be recorded: %v", c.Outcome, problem)
	return d
}
