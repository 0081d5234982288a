-- The submitters' lease and their submissions (migration 0023). Each
-- statement touches provider_batch_leases, provider_submissions and
-- provider_submission_items only, except WaitingJobs, which reads the jobs
-- a submission holds through the jobs' primary key.

-- name: TakeLease
-- $1 pool, $2 holder, $3 lease in milliseconds. Takes the pool's lease
-- for $2 when nobody holds it or it lapsed, or renews it for $2; returns
-- the epoch, which grows with every acquisition (a holder whose lease
-- lapsed gets a new one too: another submitter may have acted meanwhile).
-- No row when another submitter holds it. Two submitters taking a free
-- lease at once meet on the primary key: one inserts, the other's
-- ON CONFLICT sees the row and its WHERE refuses it.
INSERT INTO /*schema*/provider_batch_leases AS l (pool, holder, epoch, lease_until)
VALUES ($1, $2, 1, now() + $3 * interval '1 millisecond')
ON CONFLICT (pool) DO UPDATE SET
    holder      = EXCLUDED.holder,
    epoch       = CASE WHEN l.holder = EXCLUDED.holder AND l.lease_until > now() THEN l.epoch ELSE l.epoch + 1 END,
    lease_until = EXCLUDED.lease_until,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.lease_until > now() THEN l.acquired_at ELSE now() END
WHERE l.holder = EXCLUDED.holder OR l.lease_until < now()
RETURNING l.epoch;

-- name: ReleaseLease
-- $1 pool, $2 holder, $3 epoch. Frees the lease when a submitter stops,
-- so a standby takes over at its next try instead of when it lapses. The
-- epoch is kept, so the next holder's is higher.
UPDATE /*schema*/provider_batch_leases
SET lease_until = '-infinity'
WHERE pool = $1 AND holder = $2 AND epoch = $3;

-- name: HoldLease
-- $1 pool, $2 holder, $3 epoch. The first statement of every transaction
-- that writes a submission: no row unless $2 still holds the lease it
-- took with $3. FOR SHARE holds the lease row until the transaction ends,
-- so a takeover (TakeLease's update) waits for the writes made under the
-- lease to commit or roll back, and the next holder sees them all.
SELECT epoch FROM /*schema*/provider_batch_leases
WHERE pool = $1 AND holder = $2 AND epoch = $3 AND lease_until > now()
FOR SHARE;

-- name: InsertSubmission
-- Records a submission before the provider hears of it.
INSERT INTO /*schema*/provider_submissions (id, pool, provider, model, queue, requests, bytes, estimated_tokens)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8);

-- name: InsertItems
-- $1 submission, then one array element per job.
INSERT INTO /*schema*/provider_submission_items (submission_id, job_id, tenant, kind, fence, attempt)
SELECT $1, i.job_id, i.tenant, i.kind, i.fence, i.attempt
FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::integer[])
    AS i (job_id, tenant, kind, fence, attempt);

-- name: MarkSubmitted
-- $1 submission, $2 the provider's batch id, $3 its status, $4 the first
-- poll's delay in ms.
UPDATE /*schema*/provider_submissions
SET state = 'submitted', provider_batch_id = $2, provider_status = $3, submitted_at = now(),
    next_poll_at = now() + $4 * interval '1 millisecond', last_error = NULL
WHERE id = $1 AND state = 'preparing';

-- name: OpenSubmissions
-- $1 pool. Its submissions not yet ended, through
-- provider_submissions_open_idx, soonest poll first.
SELECT id, state, model, queue, coalesce(provider_batch_id, ''), requests, estimated_tokens,
    cancel_requested, polls, created_at, next_poll_at
FROM /*schema*/provider_submissions
WHERE pool = $1 AND state <> 'ended'
ORDER BY next_poll_at;

-- name: RecordPoll
-- $1 submission, $2 provider status, $3 next poll's delay in ms, $4 the
-- error of the poll, if it failed.
UPDATE /*schema*/provider_submissions
SET provider_status = coalesce($2, provider_status), polls = polls + 1,
    next_poll_at = now() + $3 * interval '1 millisecond', last_error = $4
WHERE id = $1;

-- name: SubmissionItems
-- $1 submission. Its items not yet settled, by the primary key.
SELECT job_id, tenant, kind, fence, attempt
FROM /*schema*/provider_submission_items
WHERE submission_id = $1 AND outcome IS NULL;

-- name: KnownProviderBatches
-- $1 pool, $2 since. The provider batch ids its submissions recorded since
-- then, for a search of a lost one by its shape (Provider.Find): through
-- provider_submissions_created_idx, a few rows a day per pool.
SELECT provider_batch_id
FROM /*schema*/provider_submissions
WHERE created_at >= $2 AND pool = $1 AND provider_batch_id IS NOT NULL;

-- name: PollItems
-- $1 submission, $2 the lease left (ms) under which a job's lease is
-- renewed. Its unsettled items, each with what a poll of a batch still
-- running needs of its job: whether it still waits on the submission
-- (RUNNING at the item's fence), whether a client asked to cancel it, and
-- whether its lease runs out within $2. No payloads, and nothing written:
-- a poll writes only for the jobs these say need it, so a batch polled
-- for a day costs a read per poll, not a row version per job. Through
-- provider_submission_items' primary key and the jobs' (a job pruned
-- meanwhile reads as moved on).
SELECT i.job_id, i.tenant, i.kind, i.fence, i.attempt,
    coalesce(j.state = 'RUNNING' AND j.fence = i.fence, false),
    coalesce(j.cancel_requested_at IS NOT NULL, false),
    coalesce(j.lease_until < now() + $2 * interval '1 millisecond', false)
FROM /*schema*/provider_submission_items AS i
LEFT JOIN /*schema*/jobs AS j ON j.id = i.job_id
WHERE i.submission_id = $1 AND i.outcome IS NULL;

-- name: WaitingJobs
-- $1 job ids. The payloads the requests and answers are built from, and
-- whether a client asked to cancel each, by the jobs' primary key.
SELECT id, tenant, kind, payload, attempt, fence, state, cancel_requested_at IS NOT NULL
FROM /*schema*/jobs
WHERE id = ANY ($1::uuid[]);

-- name: SettleItems
-- $1 submission, $2 job ids, $3 their outcomes. Only items not settled
-- yet: an item settled by an earlier pass (a result applied twice) keeps
-- its first outcome. Returns the items settled now.
UPDATE /*schema*/provider_submission_items AS i
SET outcome = s.outcome
FROM unnest($2::uuid[], $3::text[]) AS s (job_id, outcome)
WHERE i.submission_id = $1 AND i.job_id = s.job_id AND i.outcome IS NULL
RETURNING i.job_id;

-- name: UnbilledItems
-- $1 submission. Its items settled before their results were read (their
-- jobs cancelled or moved on while the batch ran): the provider bills
-- those results all the same, and they go into the usage ledger once
-- read. By the items' primary key; few rows.
SELECT job_id
FROM /*schema*/provider_submission_items
WHERE submission_id = $1 AND outcome IN ('stale', 'cancelled');

-- name: BillItems
-- $1 submission, $2 job ids of UnbilledItems whose results were read.
-- Marks each billed ('+billed' on its outcome) and returns its tenant and
-- kind, once: a result read again after a crash finds it marked and is
-- not billed twice. By the items' primary key.
UPDATE /*schema*/provider_submission_items
SET outcome = outcome || '+billed'
WHERE submission_id = $1 AND job_id = ANY ($2::uuid[]) AND outcome IN ('stale', 'cancelled')
RETURNING job_id, tenant, kind;

-- name: CountSettled
-- $1 submission, then how many items were settled now, by outcome.
UPDATE /*schema*/provider_submissions
SET succeeded = succeeded + $2, failed = failed + $3, stale = stale + $4,
    returned = returned + $5, skipped = skipped + $6
WHERE id = $1;

-- name: EndSubmission
-- $1 submission, $2 the provider's last status.
UPDATE /*schema*/provider_submissions
SET state = 'ended', ended_at = now(), provider_status = coalesce($2, provider_status)
WHERE id = $1 AND state <> 'ended';

-- name: RequestCancel
-- $1 submission. Asks the pool's submitter to cancel it at its next poll.
UPDATE /*schema*/provider_submissions
SET cancel_requested = true, next_poll_at = least(next_poll_at, now())
WHERE id = $1 AND state <> 'ended'
RETURNING pool;

-- name: ListSubmissions
-- $1 pool ('' for every pool), $2 limit. Newest first, through
-- provider_submissions_created_idx.
SELECT id, pool, provider, model, queue, state, coalesce(provider_batch_id, ''), coalesce(provider_status, ''),
    requests, bytes, estimated_tokens, succeeded, failed, stale, returned, skipped, cancel_requested, polls,
    coalesce(last_error, ''), created_at, submitted_at, ended_at
FROM /*schema*/provider_submissions
WHERE $1 = '' OR pool = $1
ORDER BY created_at DESC
LIMIT $2;
