package providerbatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dberr"
	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/outcome"
	"github.com/llmq/llmq/internal/telemetry"
	"github.com/llmq/llmq/jobs"
)

// applyChunk is how many outcomes one transaction records.
const applyChunk = 500

// Item outcomes beside the jobs' outcomes (jobs.CompletionOutcome).
const (
	itemStale    = "stale"    // the job no longer waited on the submission
	itemReturned = "returned" // back to waiting without a result
	// billedSuffix marks an item settled without its result applied
	// whose result is in the usage ledger (BillItems).
	billedSuffix = "+billed"
)

func hasUsage(u jobs.Usage) bool { return u.InputTokens+u.OutputTokens > 0 }

// record writes each part as a submission with its items, in one
// transaction under the lease, after extending its jobs' leases to the
// completion window. A job whose lease was lost meanwhile (the reaper
// took it back) is left out.
func (s *Submitter) record(ctx context.Context, parts []*part) error {
	var leases []jobs.Lease
	for _, p := range parts {
		for _, r := range p.requests {
			leases = append(leases, jobs.Lease{JobID: r.job.ID, Fence: r.job.Fence})
		}
	}
	return s.underLease(ctx, func(tx pgx.Tx) error {
		hb, err := s.store.Heartbeat(ctx, tx, s.worker, s.cfg.Window+s.cfg.Grace, leases)
		if err != nil {
			return fmt.Errorf("providerbatch: extending the leases of batched jobs: %w", err)
		}
		for _, p := range parts {
			p.requests = keep(p.requests, func(r request) bool { return hb.Kept[r.job.ID] })
			if len(p.requests) == 0 {
				continue
			}
			p.bytes, p.tokens = 0, 0
			n := len(p.requests)
			ids, tenants, kinds := make([]pgtype.UUID, n), make([]string, n), make([]string, n)
			fences, attempts := make([]int64, n), make([]int32, n)
			for i, r := range p.requests {
				ids[i], tenants[i], kinds[i] = dbsql.UUID(r.job.ID), r.job.Tenant, r.job.Kind
				fences[i], attempts[i] = r.job.Fence, int32(r.job.Attempt) //nolint:gosec // attempts are bounded by MaxMaxAttempts
				p.bytes += int64(len(r.body)) + lineOverhead
				p.tokens += r.tokens
			}
			if _, err := tx.Exec(ctx, s.sql.insertSubmission, dbsql.UUID(p.id), s.cfg.Pool, s.cfg.Provider.Name(), p.model,
				s.cfg.Queue, int32(n), p.bytes, p.tokens); err != nil { //nolint:gosec // n is at most maxGather
				return fmt.Errorf("providerbatch: recording a submission: %w", err)
			}
			if _, err := tx.Exec(ctx, s.sql.insertItems, dbsql.UUID(p.id), ids, tenants, kinds, fences, attempts); err != nil {
				return fmt.Errorf("providerbatch: recording a submission's jobs: %w", err)
			}
		}
		return nil
	})
}

func keep[T any](xs []T, ok func(T) bool) []T {
	kept := xs[:0]
	for _, x := range xs {
		if ok(x) {
			kept = append(kept, x)
		}
	}
	return kept
}

// create sends a recorded submission to the provider and records the
// provider's id for it. The lease is renewed first and the call bounded
// by half of it, so a submitter that lost its lease (paused, cut off)
// does not send a batch its successor may send too.
func (s *Submitter) create(ctx context.Context, id uuid.UUID, model string, requests []request) error {
	held, err := s.takeLease(ctx)
	if err != nil {
		return err
	}
	if !held {
		return errLeaseLost
	}
	batch := Batch{Submission: id, Model: model, Requests: make([]Request, len(requests))}
	for i, r := range requests {
		batch.Requests[i] = Request{CustomID: r.job.ID.String(), Body: r.body}
	}
	callCtx, cancel := context.WithTimeout(ctx, s.cfg.LeaseDuration/2)
	providerID, err := s.cfg.Provider.Create(callCtx, batch)
	cancel()
	if err != nil {
		_, _ = s.pool.Exec(ctx, s.sql.recordPoll, dbsql.UUID(id), nil, s.cfg.PollMin.Milliseconds(), err.Error())
		return fmt.Errorf("providerbatch: creating the provider batch of submission %s: %w", id, err)
	}
	return s.markSubmitted(ctx, id, providerID)
}

func (s *Submitter) markSubmitted(ctx context.Context, id uuid.UUID, providerID string) error {
	err := s.underLease(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.sql.markSubmitted, dbsql.UUID(id), providerID, "submitted", s.cfg.PollMin.Milliseconds())
		return err
	})
	if err != nil {
		return fmt.Errorf("providerbatch: recording provider batch %s for submission %s: %w", providerID, id, err)
	}
	s.logger.Info("llmq: provider batch submitted", "submission", id, "provider_batch", providerID)
	return nil
}

// work moves one open submission on: sends one left preparing, or polls a
// submitted one and applies its results once it ended.
func (s *Submitter) work(ctx context.Context, sub openRow) error {
	id := uuid.UUID(sub.id)
	if sub.state == "preparing" {
		return s.resume(ctx, sub)
	}
	if sub.cancelRequested {
		if err := s.cfg.Provider.Cancel(ctx, sub.providerBatchID); err != nil {
			s.logger.Warn("llmq: cancelling a provider batch", "submission", id, "provider_batch", sub.providerBatchID, "err", err)
		}
	}
	status, err := s.cfg.Provider.Status(ctx, sub.providerBatchID)
	if err != nil {
		s.recordPoll(ctx, id, "", sub.polls, err)
		return fmt.Errorf("providerbatch: polling provider batch %s: %w", sub.providerBatchID, err)
	}
	if !status.Ended {
		if err := s.settleWhileRunning(ctx, id); err != nil {
			return err
		}
		s.recordPoll(ctx, id, status.State, sub.polls, nil)
		return nil
	}
	items, err := s.items(ctx, id)
	if err != nil {
		return err
	}
	items, err = s.settleCancelled(ctx, id, items)
	if err != nil {
		return err
	}
	return s.apply(ctx, sub, items, status)
}

// settleWhileRunning is a poll's work on the jobs of a batch the provider
// still runs, from one read (PollItems): a job a client asked to cancel
// ends CANCELLED, one that moved on (cancelled, reaped, replayed) is
// settled stale, and only the leases about to run out (a batch running
// past Window, its leases set to Window+Grace when it was recorded) are
// renewed. Nothing else is written, so a batch polled for a day costs
// reads, not a row version per job per poll.
func (s *Submitter) settleWhileRunning(ctx context.Context, id uuid.UUID) error {
	list, err := query[pollRow](ctx, s.pool, s.sql.pollItems, dbsql.UUID(id), (s.cfg.Grace / 2).Milliseconds())
	if err != nil {
		return fmt.Errorf("providerbatch: reading the jobs of submission %s: %w", id, err)
	}
	var done []settled
	var renew []jobs.Lease
	for _, r := range list {
		job := &jobs.Job{ID: r.item.jobID, Tenant: r.item.tenant, Kind: r.item.kind, Fence: r.item.fence, Attempt: int(r.item.attempt)}
		lease := jobs.Lease{JobID: job.ID, Fence: job.Fence}
		switch {
		case !r.current:
			done = append(done, settled{c: jobs.Completion{Lease: lease}, outcome: itemStale})
		case r.cancel:
			done = append(done, settled{c: s.cancelled(job)})
		case r.leaseRunsShort:
			renew = append(renew, lease)
		}
	}
	if len(renew) > 0 {
		hb, err := s.store.Heartbeat(ctx, s.pool, s.worker, s.cfg.Window+s.cfg.Grace, renew)
		if err != nil {
			return fmt.Errorf("providerbatch: renewing the leases of submission %s: %w", id, err)
		}
		for _, l := range renew {
			if !hb.Kept[l.JobID] {
				done = append(done, settled{c: jobs.Completion{Lease: l}, outcome: itemStale})
			}
		}
	}
	return s.settle(ctx, id, done, 0)
}

// cancelled is the completion of a job a client asked to cancel while it
// was in a batch: its attempt ends cancelled, as a runner's does when a
// heartbeat hears of it.
func (s *Submitter) cancelled(job *jobs.Job) jobs.Completion {
	c := s.policy.Base(job)
	c.Outcome, c.ErrorClass, c.Error = jobs.OutcomeCancelled, jobs.ClassCancelled, "cancelled on request while in a provider batch"
	return c
}

// recordPoll notes a poll and schedules the next.
func (s *Submitter) recordPoll(ctx context.Context, id uuid.UUID, status string, polls int32, pollErr error) {
	var st, errText *string
	if status != "" {
		st = &status
	}
	if pollErr != nil {
		e := pollErr.Error()
		errText = &e
	}
	if _, err := s.pool.Exec(ctx, s.sql.recordPoll, dbsql.UUID(id), st, s.pollDelay(polls).Milliseconds(), errText); err != nil {
		s.logger.Warn("llmq: recording a provider batch poll", "submission", id, "err", err)
	}
}

// resume sends a submission recorded but not known to be at the
// provider: a predecessor died between recording it and recording the
// provider's id, or the provider refused it. If the provider holds a
// batch tagged with it, that batch is adopted; otherwise it is sent now.
func (s *Submitter) resume(ctx context.Context, sub openRow) error {
	id := uuid.UUID(sub.id)
	lost := Lost{Submission: id, Requests: int(sub.requests), Since: sub.createdAt.Add(-time.Minute)}
	known, err := s.known(ctx, lost.Since)
	if err != nil {
		return err
	}
	lost.Known = known
	found, err := s.cfg.Provider.Find(ctx, lost)
	switch {
	case errors.Is(err, ErrCannotFind):
		s.logger.Warn("llmq: the provider holds several batches that may be a lost submission's; sending it again",
			"submission", id, "requests", lost.Requests)
	case err != nil:
		s.recordPoll(ctx, id, "", sub.polls, err)
		return fmt.Errorf("providerbatch: looking for submission %s at the provider: %w", id, err)
	case len(found) > 0:
		for _, extra := range found[1:] {
			// Two batches for one submission: a predecessor sent it after
			// losing its lease. Only the first is kept; the other's
			// requests are cancelled before they are paid for, if they can
			// still be.
			s.logger.Error("llmq: the provider holds two batches for one submission; cancelling the later one",
				"submission", id, "kept", found[0], "cancelled", extra)
			if err := s.cfg.Provider.Cancel(ctx, extra); err != nil {
				s.logger.Error("llmq: cancelling a duplicate provider batch", "provider_batch", extra, "err", err)
			}
		}
		s.logger.Info("llmq: adopting a provider batch a previous submitter sent", "submission", id, "provider_batch", found[0])
		return s.markSubmitted(ctx, id, found[0])
	}
	items, err := s.items(ctx, id)
	if err != nil {
		return err
	}
	items, err = s.settleCancelled(ctx, id, items)
	if err != nil {
		return err
	}
	var requests []request
	var done []settled
	for _, it := range items {
		model, body, err := s.calls[it.job.Kind].request(ctx, it.job)
		if err == nil && model != sub.model {
			err = jobs.Permanent(fmt.Errorf("its request now names model %q, not the batch's %q", model, sub.model))
		}
		if err != nil {
			done = append(done, settled{c: s.policy.Decide(it.job, nil, err, 0)})
			continue
		}
		requests = append(requests, request{job: it.job, model: model, body: body})
	}
	if err := s.settle(ctx, id, done, 0); err != nil {
		return err
	}
	if len(requests) == 0 {
		return s.end(ctx, id, "")
	}
	return s.create(ctx, id, sub.model, requests)
}

// known is the provider batch ids the pool's submissions recorded since
// since.
func (s *Submitter) known(ctx context.Context, since time.Time) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, s.sql.knownProviderBatches, s.cfg.Pool, since)
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading the pool's provider batches: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading the pool's provider batches: %w", err)
	}
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
	}
	return known, nil
}

// item is an unsettled item of a submission, with its job as the
// submission holds it (the fence and attempt it was sent under).
type item struct {
	job *jobs.Job
	// current is false when the job's row has moved past the item's
	// fence (cancelled, reaped, replayed) or is gone.
	current bool
	cancel  bool // a client asked to cancel the job
}

// items reads a submission's unsettled items and their jobs' payloads.
func (s *Submitter) items(ctx context.Context, id uuid.UUID) (map[string]*item, error) {
	list, err := query[itemRow](ctx, s.pool, s.sql.submissionItems, dbsql.UUID(id))
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading submission %s: %w", id, err)
	}
	items := make(map[string]*item, len(list))
	ids := make([]pgtype.UUID, len(list))
	for i, r := range list {
		job := &jobs.Job{ID: r.jobID, Tenant: r.tenant, Kind: r.kind, Fence: r.fence, Attempt: int(r.attempt)}
		items[job.ID.String()] = &item{job: job}
		ids[i] = dbsql.UUID(r.jobID)
	}
	current, err := query[jobRow](ctx, s.pool, s.sql.waitingJobs, ids)
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading the jobs of submission %s: %w", id, err)
	}
	for _, r := range current {
		it := items[uuid.UUID(r.id).String()]
		it.job.Payload = r.payload
		it.current = r.fence == it.job.Fence && jobs.State(r.state) == jobs.StateRunning
		it.cancel = r.cancel
	}
	return items, nil
}

// settleCancelled settles the items whose jobs no longer wait on the
// submission, as items read them: a client asked to cancel one (its
// attempt ends cancelled), or its lease moved on (it was cancelled,
// reaped or replayed). It returns the items left. A job that changes after
// the read is caught by the fence when its result is recorded.
func (s *Submitter) settleCancelled(ctx context.Context, id uuid.UUID, items map[string]*item) (map[string]*item, error) {
	var done []settled
	for key, it := range items {
		switch {
		case !it.current:
			done = append(done, settled{c: jobs.Completion{Lease: jobs.Lease{JobID: it.job.ID, Fence: it.job.Fence}}, outcome: itemStale})
		case it.cancel:
			done = append(done, settled{c: s.cancelled(it.job)})
		default:
			continue
		}
		delete(items, key)
	}
	return items, s.settle(ctx, id, done, 0)
}

// settled is one item's end: a completion to record, or (outcome set
// and no completion) an outcome that records nothing on the job.
type settled struct {
	c       jobs.Completion
	outcome string // itemStale: nothing to record; "" : record c
	tenant  string // the job's, for the usage ledger: set with c.Usage
}

// apply reads an ended batch's results and settles every item: a result
// under its item's fence, a request the batch did not run back to waiting.
func (s *Submitter) apply(ctx context.Context, sub openRow, items map[string]*item, status Status) error {
	id := uuid.UUID(sub.id)
	var (
		pending []settled
		skipped int
		unknown int
	)
	flush := func() error {
		err := s.settle(ctx, id, pending, skipped)
		pending, skipped = pending[:0], 0
		return err
	}
	// The items settled before their results came (jobs cancelled or moved
	// on): their results are not applied, but the provider bills them.
	unbilled, err := s.unbilled(ctx, id)
	if err != nil {
		return err
	}
	toBill := map[[16]byte]json.RawMessage{}
	if !status.Failed {
		err := s.cfg.Provider.Results(ctx, sub.providerBatchID, func(r Result) error {
			it, ok := items[r.CustomID]
			switch {
			case r.Problem != "":
				skipped++
				s.logger.Warn("llmq: a provider batch result line could not be read; skipped", "submission", id, "custom_id", r.CustomID, "problem", r.Problem)
			case !ok:
				// Settled before (a result applied twice, a cancelled job)
				// or not this submission's: nothing to apply; billed if
				// its item was settled before any result.
				unknown++
				if jobID, err := uuid.Parse(r.CustomID); err == nil && unbilled[jobID] && r.Err == nil {
					toBill[jobID] = r.Body
				}
			default:
				delete(items, r.CustomID)
				pending = append(pending, s.resultOf(ctx, it.job, r))
			}
			if len(pending) >= applyChunk {
				return flush()
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("providerbatch: reading the results of provider batch %s: %w", sub.providerBatchID, err)
		}
	}
	if unknown > 0 {
		s.logger.Info("llmq: provider batch results for jobs already settled; not applied", "submission", id, "results", unknown)
	}
	if err := s.bill(ctx, id, toBill); err != nil {
		return err
	}
	// What has no result: refused with the batch, or not run before it
	// expired or was cancelled.
	for _, it := range items {
		c := s.policy.Base(it.job)
		if status.Failed {
			c = s.policy.Retry(it.job, c, jobs.ClassTransient, 0)
			c.Error = "the provider refused the batch: " + status.Reason
			pending = append(pending, settled{c: c})
		} else {
			c.Outcome, c.Error = jobs.OutcomeSnoozed, fmt.Sprintf("the provider batch ended (%s) without running it", status.State)
			pending = append(pending, settled{c: c, outcome: itemReturned})
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return s.end(ctx, id, status.State)
}

// unbilled is the submission's items settled before their results were
// read (UnbilledItems).
func (s *Submitter) unbilled(ctx context.Context, id uuid.UUID) (map[uuid.UUID]bool, error) {
	rows, err := s.pool.Query(ctx, s.sql.unbilledItems, dbsql.UUID(id))
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading submission %s: %w", id, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, fmt.Errorf("providerbatch: reading submission %s: %w", id, err)
	}
	out := make(map[uuid.UUID]bool, len(ids))
	for _, j := range ids {
		out[j] = true
	}
	return out, nil
}

// bill adds to the usage ledger the results of items settled before they
// came (bodies, by job id), each once: the item is marked billed in the
// same transaction (BillItems).
func (s *Submitter) bill(ctx context.Context, id uuid.UUID, bodies map[[16]byte]json.RawMessage) error {
	if len(bodies) == 0 {
		return nil
	}
	ids := make([]pgtype.UUID, 0, len(bodies))
	for j := range bodies {
		ids = append(ids, dbsql.UUID(j))
	}
	return s.underLease(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql.billItems, dbsql.UUID(id), ids)
		if err != nil {
			return fmt.Errorf("providerbatch: billing settled items: %w", err)
		}
		type billRow struct {
			jobID        [16]byte
			tenant, kind string
		}
		marked, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (billRow, error) {
			var b billRow
			err := row.Scan(&b.jobID, &b.tenant, &b.kind)
			return b, err
		})
		if err != nil {
			return fmt.Errorf("providerbatch: billing settled items: %w", err)
		}
		var usage []admission.BatchUsage
		for _, b := range marked {
			if call, ok := s.calls[b.kind]; ok {
				if u := call.usage(bodies[b.jobID]); hasUsage(u) {
					usage = append(usage, admission.BatchUsage{Tenant: b.tenant, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens})
				}
			}
		}
		return s.ledger.Record(ctx, tx, s.cfg.Pool, usage)
	})
}

// resultOf decides the outcome of one result line.
func (s *Submitter) resultOf(ctx context.Context, job *jobs.Job, r Result) settled {
	if r.Err != nil {
		switch r.Err.Kind {
		case RequestExpired, RequestCancelled:
			c := s.policy.Base(job)
			c.Outcome, c.Error = jobs.OutcomeSnoozed, r.Err.Error()
			return settled{c: c, outcome: itemReturned}
		case RequestRefused:
			return settled{c: s.policy.Decide(job, nil, jobs.Permanent(r.Err), 0)}
		default:
			return settled{c: s.policy.Decide(job, nil, r.Err, 0)}
		}
	}
	call, ok := s.calls[job.Kind]
	if !ok {
		return settled{c: s.policy.Decide(job, nil, jobs.Permanent(fmt.Errorf("%w %q", errNoCall, job.Kind)), 0)}
	}
	result, usage, err := call.answer(ctx, job, r.Body)
	invalidBefore := 0
	if invalid := (*jobs.InvalidOutputError)(nil); errors.As(err, &invalid) {
		invalidBefore = s.invalidAttempts(ctx, job)
	}
	c := s.policy.Decide(job, result, err, invalidBefore)
	if problem := c.Validate(); problem != nil {
		c = outcome.Defective(c, result, problem)
	}
	c.Usage = usage
	return settled{c: c, tenant: job.Tenant}
}

// invalidAttempts counts the job's earlier attempts that ended in
// invalid output (the invalid-output budget), as the lease runner does.
func (s *Submitter) invalidAttempts(ctx context.Context, job *jobs.Job) int {
	history, err := s.store.Attempts(ctx, s.pool, job.Tenant, job.ID)
	if err != nil {
		s.logger.Warn("llmq: reading the attempt history for the invalid-output budget", "job", job.ID, "err", err)
		return 0
	}
	n := 0
	for _, a := range history {
		if a.ErrorClass == jobs.ClassInvalidOutput {
			n++
		}
	}
	return n
}

// settle records outcomes in one transaction under the lease: the jobs'
// completions, each under its fence, and the items settled with them, so
// a result read again after a crash finds its item settled and changes
// nothing. A completion whose fence moved on settles its item as stale.
func (s *Submitter) settle(ctx context.Context, id uuid.UUID, done []settled, skipped int) error {
	for len(done) > 0 || skipped > 0 {
		chunk := done[:min(len(done), applyChunk)]
		done = done[len(chunk):]
		if err := s.settleChunk(ctx, id, chunk, skipped); err != nil {
			return err
		}
		skipped = 0
	}
	return nil
}

func (s *Submitter) settleChunk(ctx context.Context, id uuid.UUID, chunk []settled, skipped int) error {
	var completions []jobs.Completion
	var tenants []string
	var at []int
	for i, d := range chunk {
		if d.outcome != itemStale {
			completions = append(completions, d.c)
			tenants = append(tenants, d.tenant)
			at = append(at, i)
		}
	}
	return s.underLease(ctx, func(tx pgx.Tx) error {
		outcomes := make([]string, len(chunk))
		for i, d := range chunk {
			outcomes[i] = d.outcome
		}
		if len(completions) > 0 {
			results, err := s.completeOn(ctx, tx, completions, tenants)
			if err != nil {
				return err
			}
			for k, r := range results {
				i := at[k]
				switch {
				case errors.Is(r.Err, jobs.ErrLeaseLost) && hasUsage(completions[k].Usage):
					// Billed below with the others: marked so, a result
					// read again after a crash is not billed twice.
					outcomes[i] = itemStale + billedSuffix
				case errors.Is(r.Err, jobs.ErrLeaseLost):
					outcomes[i] = itemStale
				case outcomes[i] == "":
					outcomes[i] = string(completions[k].Outcome)
				}
			}
		}
		var counts [5]int32        // succeeded, failed, stale, returned, skipped
		counts[4] = int32(skipped) //nolint:gosec // bounded by a chunk's lines
		ids := make([]pgtype.UUID, len(chunk))
		for i, d := range chunk {
			ids[i] = dbsql.UUID(d.c.JobID)
		}
		rows, err := tx.Query(ctx, s.sql.settleItems, dbsql.UUID(id), ids, outcomes)
		if err != nil {
			return fmt.Errorf("providerbatch: settling items: %w", err)
		}
		settledNow, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
		if err != nil {
			return fmt.Errorf("providerbatch: settling items: %w", err)
		}
		now := make(map[[16]byte]bool, len(settledNow))
		for _, j := range settledNow {
			now[j] = true
		}
		for i, d := range chunk {
			if !now[d.c.JobID] {
				continue
			}
			switch outcomes[i] {
			case string(jobs.OutcomeSucceeded):
				counts[0]++
			case itemStale, itemStale + billedSuffix:
				counts[2]++
			case itemReturned:
				counts[3]++
			default:
				counts[1]++
			}
		}
		if _, err := tx.Exec(ctx, s.sql.countSettled, dbsql.UUID(id), counts[0], counts[1], counts[2], counts[3], counts[4]); err != nil {
			return fmt.Errorf("providerbatch: counting settled items: %w", err)
		}
		return s.ledger.Record(ctx, tx, s.cfg.Pool, billed(chunk, now))
	})
}

// billed is the usage the provider reported for the results of chunk
// settled now, for the usage ledger: whether the result was applied or
// found stale, the provider served the request and bills it. A result
// settled before (read again after a crash) is not billed twice.
func billed(chunk []settled, now map[[16]byte]bool) []admission.BatchUsage {
	var usage []admission.BatchUsage
	for _, d := range chunk {
		u := d.c.Usage
		if now[d.c.JobID] && hasUsage(u) {
			usage = append(usage, admission.BatchUsage{Tenant: d.tenant, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens})
		}
	}
	return usage
}

// hookAttempts is how many times a result whose OnSucceeded hook fails is
// recorded with the hook before it is recorded without it, as a retry: as
// the lease runner does.
const hookAttempts = 3

// hookError is the host's OnSucceeded hook failing.
type hookError struct{ err error }

func (e *hookError) Error() string { return "OnSucceeded hook: " + e.err.Error() }
func (e *hookError) Unwrap() error { return e.err }

// completeOn records completions in tx, with the host's OnSucceeded hook
// for each success; tenants holds each completion's job's tenant. If the
// store refuses the batch for what one of them holds, or a hook fails,
// each is recorded alone in a savepoint: one whose hook keeps failing is
// recorded as a transient failure without the hook (the job goes back for
// a later batch, as a runner's would), one refused again as unrecordable,
// failing its job alone.
func (s *Submitter) completeOn(ctx context.Context, tx pgx.Tx, completions []jobs.Completion, tenants []string) ([]jobs.CompletionResult, error) {
	results, err := s.completeHooked(ctx, tx, completions, tenants, true)
	if err == nil || dberr.Connection(err) || ctx.Err() != nil {
		return results, err
	}
	results = make([]jobs.CompletionResult, len(completions))
	for i, c := range completions {
		one, err := s.completeAlone(ctx, tx, c, tenants[i])
		if err != nil {
			return nil, err
		}
		results[i] = one
	}
	return results, nil
}

// completeAlone records c in a savepoint of tx, falling back as
// completeOn says.
func (s *Submitter) completeAlone(ctx context.Context, tx pgx.Tx, c jobs.Completion, tenant string) (jobs.CompletionResult, error) {
	var err error
	tenants := []string{tenant}
	for range hookAttempts {
		var res []jobs.CompletionResult
		if res, err = s.completeHooked(ctx, tx, []jobs.Completion{c}, tenants, true); err == nil {
			return res[0], nil
		}
		if hookErr := (*hookError)(nil); !errors.As(err, &hookErr) {
			break
		}
	}
	if hookErr := (*hookError)(nil); errors.As(err, &hookErr) {
		s.logger.Error("llmq: the OnSucceeded hook keeps failing for a provider batch result; the job is retried",
			"job", c.JobID, "err", err)
		c.Outcome, c.ErrorClass, c.Error, c.Result = jobs.OutcomeRetry, jobs.ClassTransient, err.Error(), nil
		c.RetryDelay = s.cfg.Retry.Delay(c.Attempt, nil)
		var res []jobs.CompletionResult
		if res, err = s.completeHooked(ctx, tx, []jobs.Completion{c}, tenants, false); err == nil {
			return res[0], nil
		}
	}
	if dberr.Connection(err) || ctx.Err() != nil {
		return jobs.CompletionResult{}, err
	}
	s.logger.Error("llmq: PostgreSQL refused a provider batch result; the job fails with class "+jobs.ClassUnrecordable,
		"job", c.JobID, "outcome", c.Outcome, "err", err)
	res, err := s.completeHooked(ctx, tx, []jobs.Completion{outcome.Unrecordable(c, err)}, tenants, false)
	if err != nil {
		return jobs.CompletionResult{}, err
	}
	return res[0], nil
}

// completeHooked records completions in a savepoint of tx and, when
// hooked, runs the OnSucceeded hook for each success in it, in the job's
// trace. A hook's error (other than the database's) is a *hookError.
//
// The hook is given the job as recorded, read back in the savepoint (one
// primary-key read per success, by its tenant in tenants): Complete
// returns only what it wrote, and the submitter holds no more of a job
// than its request needed.
func (s *Submitter) completeHooked(ctx context.Context, tx pgx.Tx, completions []jobs.Completion, tenants []string, hooked bool) ([]jobs.CompletionResult, error) {
	var results []jobs.CompletionResult
	err := dbsql.WithTx(ctx, tx, func(sp pgx.Tx) error {
		var err error
		if results, err = s.store.Complete(ctx, sp, completions); err != nil || !hooked || s.cfg.OnSucceeded == nil {
			return err
		}
		for i, res := range results {
			if res.Err != nil || res.State != jobs.StateSucceeded {
				continue
			}
			job, err := s.store.Get(ctx, sp, tenants[i], res.JobID)
			if err != nil {
				return fmt.Errorf("providerbatch: reading job %s for the OnSucceeded hook: %w", res.JobID, err)
			}
			if err := s.cfg.OnSucceeded(telemetry.RemoteContext(ctx, job.TraceParent), sp, job); err != nil {
				if dberr.Connection(err) {
					return err
				}
				return &hookError{err: err}
			}
		}
		return nil
	})
	return results, err
}

// complete records outcomes of jobs not in any submission (refused before
// a batch was made, or reused), under the lease; claimed are the jobs they
// are of.
func (s *Submitter) complete(ctx context.Context, done []jobs.Completion, claimed []*jobs.Job) error {
	tenantOf := make(map[uuid.UUID]string, len(claimed))
	for _, j := range claimed {
		tenantOf[j.ID] = j.Tenant
	}
	for len(done) > 0 {
		chunk := done[:min(len(done), applyChunk)]
		done = done[len(chunk):]
		tenants := make([]string, len(chunk))
		for i, c := range chunk {
			tenants[i] = tenantOf[c.JobID]
		}
		err := s.underLease(ctx, func(tx pgx.Tx) error {
			_, err := s.completeOn(ctx, tx, chunk, tenants)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// end marks a submission ended.
func (s *Submitter) end(ctx context.Context, id uuid.UUID, status string) error {
	var st *string
	if status != "" {
		st = &status
	}
	err := s.underLease(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, s.sql.endSubmission, dbsql.UUID(id), st)
		return err
	})
	if err != nil {
		return fmt.Errorf("providerbatch: ending submission %s: %w", id, err)
	}
	return nil
}
