// Package invoice is the invoice-extraction service of llmq's motivating
// scenario, wired from llmq's packages the way a host service would: an HTTP
// API that accepts extractions durably, a worker that runs them against an
// OpenAI-compatible provider within the provider's quota, a versioned
// validation policy, signed webhooks to the tenant's ERP, and a stream of
// "job changed" events. Command ./cmd/invoice runs it; ../demo runs the whole
// pipeline in one process.
//
// # API
//
//   - Tenants authenticate with bearer tokens (Auth); the tenant comes from
//     the credential, never from a body. Every read is tenant-scoped: another
//     tenant's job is 404, like a job that does not exist.
//   - PUT /documents/{name} stores OCR text as an immutable object version
//     and returns {name, version, sha256}. POST /extraction-jobs names a
//     document by version and digest (a signed URL is not an identity); the
//     digest must match the stored version (422 otherwise).
//   - POST /extraction-jobs requires an Idempotency-Key. A new job is 202 with
//     Location and {job_id, state, status_url}; the same key with the same
//     request is 200 with the same job; the same key with another request is
//     409. The request hash covers the document digest and version, the
//     schema, the validation policy and the model: what changes the result,
//     not the document's name.
//   - Tenant quotas (admission.Quotas, in the enqueue transaction) answer 429
//     with Retry-After, system capacity 503 with Retry-After.
//   - Bad input is a 4xx with a JSON error {code, field, message} naming the
//     field at fault, answered before any query: 400 for a body that is not
//     exactly one JSON object of known fields (trailing bytes, a second
//     value, an unknown field, a value of the wrong type) or a missing
//     Idempotency-Key; 413 for a body over its limit (16 KiB, or 256 KiB of
//     document text); 422 for a value the API refuses, including every value
//     the database could not hold: a document version outside 1 to
//     2147483647 (an integer column), a name that is not 1 to 200 letters,
//     digits, '.', '_' or '-' (so no NUL and nothing that is not UTF-8),
//     document text that is not UTF-8 or holds a NUL byte, an
//     Idempotency-Key over 255 bytes, not UTF-8 or with a control character.
//   - A failure of the service's own is 503 with Retry-After (the database,
//     which a retry may find back) or 500 (a request it can never serve),
//     and each is logged with its cause through Config.Logger
//     (slog.Default() unless set).
//   - Both POSTs take an optional needed_by (RFC 3339): the latest time
//     the extraction is needed, the job's deadline. With Config.BatchLane
//     on, a document needed at least BatchLead (25 hours) ahead waits in
//     BatchQueue and goes through the provider's Batch API at half price
//     (see Batch lane); one needed sooner is extracted synchronously. A
//     needed_by less than a minute ahead is 422, one that is not a time
//     400, both naming needed_by.
//   - GET /extraction-jobs/{id} is authoritative. Attempts and errors are
//     shown to operator credentials only.
//   - POST /extraction-batches accepts an upload: 1 to MaxUploadDocuments
//     documents, each named as in POST /extraction-jobs, as one batch
//     (jobs.EnqueueBatch) in one transaction, idempotent per
//     Idempotency-Key: 202 with Location and the jobs in document order,
//     200 with the batch and the same jobs for the same key and documents
//     (a client that lost the first answer learns them), 409 for the same
//     key with others. Every document is checked in one query before
//     anything is written; a bad one is 422 naming it
//     ("documents[3].sha256"), a document named twice too (it would be
//     extracted and paid for twice), and a quota refusal refuses all of
//     them. GET /extraction-batches/{id} is its progress (BatchView), one
//     primary-key probe at any size.
//   - GET /extraction-jobs/events streams {event_id, type, job_id, state,
//     state_version, batch_id} and, for uploads, batch.progress and
//     batch.completed (BatchNotification); see the events handler for the
//     replay window. A
//     stream replaces the server's write timeout with a deadline per write
//     (30s; a keep-alive comment goes out every 15s), so it lives as long
//     as its client reads, and no longer.
//
// # Worker
//
// The runner (lease) claims extraction jobs only while the provider pool's
// shared admission limiter can grant, and holds a permit per call. The
// client is the official openai-go SDK under llmq's adapter
// (provider/openai): its retries are off (one call per attempt, llmq owns
// retries), every answer reaches admission, so Retry-After and
// x-ratelimit-* headers cool the pool down for every worker, and the usage
// each answer reports is recorded for its attempt. The adapter classifies
// failures: a call never sent refunds its permit, one sent without an
// answer (timeout, 5xx, lost connection) is marked uncertain, a 429 with a
// wait snoozes the job for it, other 4xx fail it.
//
// # Model route
//
// With WorkerConfig.Fallback the worker routes extractions (lease.Route,
// extractionRoute): the primary candidate (PrimaryCandidate) is the
// worker's provider, asked for Model in OpenAI's dialect through an
// llmqopenai.Client under the worker's Pool; the fallback
// (FallbackCandidate) a model served through Anthropic's Messages API,
// through an llmqanthropic.Client under a pool of its own. Both pools are
// in Admission.QueuePools, so a cooling primary does not stop claims. An
// attempt takes the primary when its pool grants within
// WorkerConfig.MaxWait, else the fallback; a primary call answered 429,
// 5xx, timed out or unreachable moves to the fallback inside the same
// attempt. One handler (routedExtractor) serves both: the extraction is
// one providerbatch.Call per dialect (extractCall, messagesCall) with the
// same system prompt, document framing and output budget within the
// permit, and the same checks of the answer (checkAnswer), so validation,
// review and invalid output do not depend on the candidate. Attempts
// record the candidate and model that served and the calls that moved on
// (jobs.Attempt.Candidate, Model, Moves); the usage ledger has each call
// under its pool. The batch lane stays on the primary.
//
// Payload.Model is the model the job was accepted for: the request hash
// and the reuse key hold it, and it names the route by its primary. With a
// route, the candidate's model wins: the primary is asked for Model, the
// fallback for Fallback.Model, whatever the payload says; the attempt
// records which served. The reuse key names the route (Payload.Model and
// RouteVersion), never the candidate that served: either answer is the
// route's.
//
// Package ./drill is the primary-outage drill: the primary model stormed
// (429) or out (503) under a backlog, with its figures (the fallback's
// throughput against its quota, the primary's share once healed, missed
// deadlines, provider calls against the attempts' records) checked
// against targets; ./cmd/invoice -drill primary-outage runs it.
//
// # Batch lane
//
// The extraction's provider call is one providerbatch.Call (extractCall):
// the same request builder and answer checks serve the worker's
// synchronous calls and the batch submitter (NewBatchSubmitter), so a
// document's result, its review findings and its webhook delivery
// (onSucceeded, the runner's hook, given to the submitter too) do not
// depend on the lane. The submitter sends the lane's documents through
// OpenAI's Files and Batches endpoints, one active per provider pool; the
// usage ledger records their cost at the pool's batch price. A document
// whose batch expired when too little of its time is left goes to the
// worker's queue (providerbatch.Config.SyncQueue) and is extracted
// synchronously rather than failed.
//
// # Result reuse
//
// Extractions opt in to jobs.Reuse (extractionReuse): a document whose
// bytes the tenant had extracted in the last day, by a job that
// succeeded, takes that result instead of calling the provider, and one
// whose bytes are being extracted waits for that extraction. The key is
// jobs.ReuseKey over what decides the answer: the model and the route
// (RouteVersion), the prompt
// (PromptVersion, which a changed prompt must change), the schema, the
// validation policy and the SHA-256 of the document's bytes (computed by
// PUT /documents, checked against the stored version when the job is
// accepted), and the lane. Not the document's name or version, nor the
// Idempotency-Key: the same invoice uploaded again under another name or
// key is a new job but not a new provider call. The lane is in the key
// because a job waits while another of its key runs, and a job in the
// batch lane runs for up to a day. The key is the tenant's own
// (Reuse.Shared false): documents are private, and each result passed the
// policy against the tenant's supplier master data, so PutSupplier
// invalidates the tenant's results (jobs.InvalidateReuse) when it changes
// an IBAN on file. A reused job is a success like a computed one, its
// attempt recorded as "reused" and naming its source: the same result,
// lifecycle events and webhook, the webhook naming its own job and
// document (the hook reads nothing but the job's payload and result). A
// result sent to REVIEW_REQUIRED is never reused: another copy of that
// document is extracted, and reviewed, again.
//
// # Validation policy
//
// PolicyVersion ("invoice-policy/v1") checks the schema, line-item
// arithmetic, allowed currencies, the supplier against master data (name and
// IBAN), and that every field's evidence quote is in the OCR text and holds
// the value. Output that is not JSON is invalid output (retried within the
// runner's budget, then REVIEW_REQUIRED). Output that is inspectable but
// breaks a rule is REVIEW_REQUIRED with its findings: never delivered to the
// ERP, and no field is dropped or nulled to make it pass. Fields outside the
// schema (a "send_to" a document talked the model into) are findings, never
// acted on: model output is data.
//
// # Decisions
//
//   - The API enqueues through a job store with the quota hook; the runner
//     and the webhook store use one without it, so a webhook delivery created
//     when an extraction succeeds is never refused by the tenant's quota.
//   - Successful extractions enqueue their webhook deliveries in
//     lease.Config.OnSucceeded, in the transaction that records the success.
//   - A finished upload's webhook (BatchCompletedEvent) comes from the job
//     store's batch.completed outbox event, through the relay's publisher
//     (EventPublisher, run by NewEventRelay in the workers), not from a
//     hook: the statement that finishes a batch's last job may be a
//     runner's completion, the reaper's, a passed deadline or a cancel from
//     any process, and every one of them writes that event. The relay
//     publishes at least once; the webhook's event id is the batch id, so
//     each endpoint gets one delivery per upload.
//   - The event stream reads the job store's lifecycle events from the
//     outbox by sequence number, from both of its tables (single-event
//     rows and batch rows); llmq has no change-feed API (see
//     docs/examples.md).
package invoice
