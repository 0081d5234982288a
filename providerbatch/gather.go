package providerbatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/jobs"
)

// maxGather bounds the jobs one gather claims: a provider's batch at most
// (OpenAI's 50,000 requests), so a pass's memory stays bounded.
const maxGather = 50_000

// request is one job's request, built and sized.
type request struct {
	job    *jobs.Job
	model  string
	body   json.RawMessage
	tokens int64
}

// part is one batch to send: requests of one model within the limits.
type part struct {
	id       uuid.UUID
	model    string
	requests []request
	bytes    int64
	tokens   int64
}

// gather claims the jobs waiting in the queue, builds their requests,
// splits them into batches within the provider's limits, records each
// batch with its jobs' leases extended to the completion window, and
// sends them.
func (s *Submitter) gather(ctx context.Context, open []openRow) error {
	enqueued := map[string]int64{}
	for _, sub := range open {
		enqueued[sub.model] += sub.estimatedTokens
	}
	most := s.claimBudget(open)
	if most == 0 {
		return nil // the pool's batches hold all the provider takes; wait for them
	}
	claimed, err := s.claim(ctx, most)
	if err != nil || len(claimed) == 0 {
		return err
	}
	requests, done, late := s.build(ctx, claimed)
	done = append(done, s.moveToSync(ctx, late)...)
	parts, deferred, refused := s.split(requests, enqueued)
	done = append(done, refused...)
	for _, r := range deferred {
		// Over the enqueued-token limit this pass: back to waiting, the
		// attempt not counted, until earlier batches end.
		c := s.policy.Base(r.job)
		c.Outcome, c.RetryDelay = jobs.OutcomeSnoozed, s.cfg.GatherInterval
		c.Error = "the pool's batches already hold the provider's enqueued-token limit"
		done = append(done, c)
	}
	if err := s.complete(ctx, done, claimed); err != nil {
		return err
	}
	if len(parts) == 0 {
		return nil
	}
	if err := s.record(ctx, parts); err != nil {
		return err
	}
	for _, p := range parts {
		if err := s.create(ctx, p.id, p.model, p.requests); err != nil {
			if errors.Is(err, errLeaseLost) || ctx.Err() != nil {
				return err
			}
			s.logger.Warn("llmq: sending a provider batch failed; it is tried again at the next poll", "submission", p.id, "err", err)
		}
	}
	return nil
}

// claimBudget is how many jobs a gather may claim: maxGather, or, under an
// enqueued-token limit, as many as the room the open batches leave holds
// at their average tokens a request. A job claimed past the room is
// deferred with a snoozed attempt, so claiming only what is likely to fit
// keeps a long wait on the limit from writing an attempt per job at every
// gather. Zero: no room; claim nothing.
func (s *Submitter) claimBudget(open []openRow) int {
	if s.limits.MaxEnqueuedTokens <= 0 {
		return maxGather
	}
	var tokens, requests int64
	for _, sub := range open {
		tokens += sub.estimatedTokens
		requests += int64(sub.requests)
	}
	room := s.limits.MaxEnqueuedTokens - tokens
	switch {
	case room <= 0:
		return 0
	case requests == 0 || tokens == 0:
		return maxGather // nothing to measure a request by yet
	}
	return int(min(room*requests/tokens, maxGather))
}

// claim leases up to most of the queue's waiting jobs for the time it
// takes to build and record their batches: a submitter that dies before
// recording them leaves them to the reaper after DefaultPrepareLease.
func (s *Submitter) claim(ctx context.Context, most int) ([]*jobs.Job, error) {
	var claimed []*jobs.Job
	for len(claimed) < most {
		limit := min(jobs.MaxBatch, most-len(claimed))
		if s.limits.MaxRequests > 0 {
			limit = min(limit, s.limits.MaxRequests)
		}
		batch, err := s.store.Claim(ctx, s.pool, jobs.ClaimParams{
			Queue: s.cfg.Queue, Kinds: s.kinds, Worker: s.worker, Limit: limit, LeaseDuration: DefaultPrepareLease,
		})
		if err != nil {
			return claimed, fmt.Errorf("providerbatch: claiming from %s: %w", s.cfg.Queue, err)
		}
		claimed = append(claimed, batch...)
		if len(batch) < limit {
			break
		}
	}
	return claimed, nil
}

// build makes each claimed job's request. A job that cannot go into a
// batch gets its completion in done instead (its claim found a result to
// reuse; its request cannot be built;
// its deadline is sooner than the window and there is no SyncQueue), or
// is returned in late (its deadline is sooner than the window: for
// SyncQueue).
func (s *Submitter) build(ctx context.Context, claimed []*jobs.Job) (requests []request, done []jobs.Completion, late []*jobs.Job) {
	latest := time.Now().Add(s.cfg.Window)
	for _, job := range claimed {
		if job.ReusedFrom != uuid.Nil {
			done = append(done, s.reused(job))
			continue
		}
		if !job.DeadlineAt.IsZero() && job.DeadlineAt.Before(latest) {
			if s.cfg.SyncQueue != "" {
				late = append(late, job)
				continue
			}
			done = append(done, s.tooLate(job))
			continue
		}
		model, body, err := s.calls[job.Kind].request(ctx, job)
		if err == nil && model == "" {
			err = jobs.Permanent(errors.New("the request names no model"))
		}
		if err != nil {
			done = append(done, s.policy.Decide(job, nil, err, 0))
			continue
		}
		tokens := job.EstimatedTokens
		if tokens <= 0 {
			tokens = int64(len(body))/4 + 1 // about four bytes a token, as providers count
		}
		requests = append(requests, request{job: job, model: model, body: body, tokens: tokens})
	}
	return requests, done, late
}

// reused is the success of a job whose claim found a result to reuse
// (jobs.Reuse): recorded with that result, naming its source, and sent to
// no provider, as a runner records it.
func (s *Submitter) reused(job *jobs.Job) jobs.Completion {
	c := s.policy.Base(job)
	c.Outcome, c.Result, c.ReusedFrom = jobs.OutcomeSucceeded, job.Result, job.ReusedFrom
	return c
}

// tooLate fails a job whose deadline leaves no room for a batch.
func (s *Submitter) tooLate(job *jobs.Job) jobs.Completion {
	c := s.policy.Base(job)
	c.Outcome, c.ErrorClass = jobs.OutcomeFailed, jobs.ClassDeadline
	c.Error = fmt.Sprintf("its deadline %s is sooner than the provider batch window (%s): enqueue it to a synchronous queue, or with a later DeadlineAt",
		job.DeadlineAt.UTC().Format(time.RFC3339), s.cfg.Window)
	return c
}

// moveToSync hands the late jobs to SyncQueue, each under its fence, in
// transactions of applyChunk moves under the pool's lease. If the store
// refuses the moves (SyncQueue is not one of its queues), the jobs are
// failed as tooLate instead, in the completions returned, rather than
// left leased; if the database fails, their short gather leases run out
// and the reaper returns them, for the next gather to try again.
func (s *Submitter) moveToSync(ctx context.Context, late []*jobs.Job) []jobs.Completion {
	var failed []jobs.Completion
	for len(late) > 0 {
		chunk := late[:min(len(late), applyChunk)]
		late = late[len(chunk):]
		moved := 0
		err := s.underLease(ctx, func(tx pgx.Tx) error {
			moved = 0
			for _, job := range chunk {
				reason := fmt.Sprintf("its deadline %s is sooner than the provider batch window (%s): moved to the synchronous queue %q",
					job.DeadlineAt.UTC().Format(time.RFC3339), s.cfg.Window, s.cfg.SyncQueue)
				_, err := s.store.Move(ctx, tx, jobs.MoveParams{Lease: jobs.Lease{JobID: job.ID, Fence: job.Fence}, Worker: s.worker, Queue: s.cfg.SyncQueue, Reason: reason})
				switch {
				case err == nil:
					moved++
				case errors.Is(err, jobs.ErrLeaseLost): // moved on meanwhile: nothing to hand over
				default:
					return err
				}
			}
			return nil
		})
		switch {
		case err == nil:
			s.logger.Info("llmq: jobs too late for a provider batch moved to the synchronous queue", "jobs", moved, "queue", s.cfg.SyncQueue)
		case errors.Is(err, jobs.ErrInvalidParams):
			s.logger.Error("llmq: moving jobs to SyncQueue was refused; they fail with class deadline", "jobs", len(chunk), "queue", s.cfg.SyncQueue, "err", err)
			for _, job := range chunk {
				failed = append(failed, s.tooLate(job))
			}
		default:
			s.logger.Warn("llmq: moving jobs to SyncQueue; the reaper returns them for the next gather", "jobs", len(chunk), "err", err)
		}
	}
	return failed
}

// split groups requests by model into parts within the limits, in claim
// order. Requests that would take the pool past its enqueued-token limit
// are deferred.
func (s *Submitter) split(requests []request, enqueued map[string]int64) (parts []*part, deferred []request, done []jobs.Completion) {
	current := map[string]*part{}
	var enqueuedAll int64
	for _, t := range enqueued {
		enqueuedAll += t
	}
	for _, r := range requests {
		size := int64(len(r.body)) + lineOverhead
		if s.limits.MaxBytes > 0 && size > s.limits.MaxBytes {
			done = append(done, s.policy.Decide(r.job, nil, jobs.Permanent(fmt.Errorf(
				"its request is %d bytes, over the provider's %d bytes a batch", size, s.limits.MaxBytes)), 0))
			continue
		}
		if s.limits.MaxEnqueuedTokens > 0 && enqueuedAll+r.tokens > s.limits.MaxEnqueuedTokens {
			deferred = append(deferred, r)
			continue
		}
		enqueuedAll += r.tokens
		p := current[r.model]
		full := p != nil && ((s.limits.MaxRequests > 0 && len(p.requests) >= s.limits.MaxRequests) ||
			(s.limits.MaxBytes > 0 && p.bytes+size > s.limits.MaxBytes))
		if p == nil || full {
			p = &part{id: uuid.New(), model: r.model}
			parts = append(parts, p)
			current[r.model] = p
		}
		p.requests = append(p.requests, r)
		p.bytes += size
		p.tokens += r.tokens
	}
	return parts, deferred, done
}
