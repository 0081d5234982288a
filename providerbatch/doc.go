// Package providerbatch serves jobs through a provider's batch API
// (OpenAI's Batch API, Anthropic's Message Batches) at its batch price,
// half the synchronous one, for work that can wait up to the provider's
// completion window (24 hours).
//
// # One call, two paths
//
// A kind's provider call is declared once, with NewCall: a request builder
// and a result parser around the provider's own request and answer types
// (a Codec: provider/openai.Chat for chat completions). The same Call
// serves both paths, so the same validation, jobs.InvalidOutput,
// jobs.NeedsReview and result encoding apply to an answer however it came:
//
//	var Extract = jobs.NewKind[ExtractArgs, Invoice]("invoice.extract")
//	var extract = providerbatch.NewCall(Extract, openai.Chat{}, buildExtract, parseExtract)
//
//	func buildExtract(ctx context.Context, job *jobs.Job, a ExtractArgs) (oai.ChatCompletionNewParams, error)
//	func parseExtract(ctx context.Context, job *jobs.Job, a ExtractArgs, c *oai.ChatCompletion) (Invoice, error)
//
//	// synchronous: a lease.Runner's handler, for the queue "extract"
//	lease.Config{Handlers: lease.Kinds(extract.Handle(func(ctx context.Context, req oai.ChatCompletionNewParams) (*oai.ChatCompletion, error) {
//		return openai.Call(ctx, func(ctx context.Context) (*oai.ChatCompletion, error) { return client.Chat.Completions.New(ctx, req) })
//	}))}
//	// batch: a Submitter for the queue "extract-batch", handing what is
//	// too late for a batch to "extract"
//	providerbatch.NewSubmitter(pool, store, providerbatch.Config{
//		Pool: "openai", Queue: "extract-batch", SyncQueue: "extract",
//		Provider: batches, Calls: []providerbatch.KindCall{extract.Batch()}})
//
// # Which jobs wait for a batch
//
// A job waits for a batch when it is enqueued to a Submitter's queue
// (Config.Queue), with the latest time its result is needed as its
// DeadlineAt: the queue is the choice of path, made per job at enqueue,
// and the job's Queue column says which path it is on. No lease.Runner
// serves that queue. The decision follows River's and Oban's queues: a
// queue says who works a job; here the worker is the pool's submitter.
//
// A job whose deadline is sooner than now plus Config.Window (the
// provider's 24 hours) when the submitter gathers it cannot be sure of an
// answer in time: enqueued too late, or returned by an expired or
// cancelled batch once its time has grown short. With Config.SyncQueue it
// is moved there (jobs.RunnerStore.Move: its attempt snoozed, not counted)
// for a runner serving the same Call's Handle, at the synchronous price;
// without one it fails with class "deadline" and an error that says so,
// rather than wait in a batch that may end too late. The choice is the
// host's, per submitter: a queue of runners is what a synchronous call
// needs (admission, workers, timeouts), which the submitter does not
// have.
//
// Jobs that opted in to result reuse (jobs.Reuse) are claimed by a
// gather as a runner claims them: one whose claim found a result to take is
// recorded as reused at once, sent to no provider, with the OnSucceeded
// hook; one whose key is already in a batch waits for that batch's result
// instead of joining another.
//
// # A batch is an attempt
//
// A job sent in a batch is RUNNING, leased to "providerbatch:<pool>" for
// Window+Grace, and its batch request is one attempt, recorded as a row
// like any other: its result applies only under the fence of that
// attempt, through the same jobs.RunnerStore.Complete a runner uses.
//
//   - A result is decided by the kind's parser as on the synchronous path;
//     its usage is the attempt's, and goes into the usage ledger
//     (admission_usage, through admission.BatchLedger) in the same
//     transaction, at the pool's batch prices: admission.Pool's
//     BatchInputPrice and BatchOutputPrice, by default half the
//     synchronous ones. The result of a job cancelled or moved on
//     meanwhile is not applied but is billed too, once (its item is
//     marked when it is): the provider served it. Batch requests take no admission permit: the provider's
//     batch limits, not the pool's RPM and TPM, bound them.
//   - Config.OnSucceeded, the host's hook (lease.SucceededHook), runs in
//     the transaction that records each success, as a runner's does: give
//     both paths the same hook and a job's side effects (a webhook
//     delivery) do not depend on the path. A hook that fails three times
//     for a result records it as a transient failure without the hook;
//     the job goes to a later batch.
//   - A request the provider refused (HTTP 4xx other than 408, 409, 429)
//     fails its job (permanent); one the provider failed (5xx, 429) is
//     retried with backoff as a transient failure, into a later batch.
//   - A request the batch did not run (the batch expired or was
//     cancelled) returns its job to waiting, the attempt not counted
//     against MaxAttempts (snoozed); a later gather sends it again if its
//     deadline still allows, else hands it to SyncQueue (above).
//   - A job cancelled by a client while in a batch ends CANCELLED at the
//     next poll (its attempt "cancelled"), and its result, when it comes,
//     is not applied: the item is recorded as stale. So is the result of
//     a job whose lease moved on in any other way.
//   - A result line that is not JSON, has no custom_id or neither
//     response nor error is counted as skipped and logged; one naming a
//     job the submission does not hold (or holds no more) is not applied.
//     Neither stops the submitter.
//
// # One submitter per pool, fenced
//
// Run a Submitter in every process that may. One holds the pool's lease
// (provider_batch_leases, Config.LeaseDuration) and works; the others
// stand by and take over when it lapses or is released. Every write is
// made in a transaction that first holds the lease row (FOR SHARE) at the
// epoch the submitter acquired: a submitter that lost the lease writes
// nothing, and a takeover waits for the writes made under the old lease.
//
// # Crash safety
//
// A submission (provider_submissions) and its jobs, each under its fence
// (provider_submission_items), are recorded in one transaction, with the
// jobs' leases extended to the window, before the provider is called;
// the submission's id (llmq's own) goes into the provider batch's
// metadata. The provider's id is recorded after. A submitter killed:
//
//   - before recording: its jobs' short gather leases (5 minutes) expire
//     and the reaper returns them to waiting; nothing was sent.
//   - after recording, before or during the provider's create, or after
//     it and before recording its id: the submission is "preparing". The
//     next holder lists the provider's batches for one tagged with the
//     submission's id; it adopts one it finds and sends the submission
//     only if none exists. If a paused predecessor created a second one,
//     the later is cancelled and the incident logged at ERROR.
//     A provider whose batches carry no tag (Anthropic's Message Batches)
//     is searched by shape (Provider.Find, Lost): the one batch of the
//     submission's size created since it was recorded that no submission
//     of the pool knows is adopted. If there are several (another client
//     of the same workspace made one of that size meanwhile), which is
//     the submission's cannot be told (ErrCannotFind): it is sent again,
//     and the provider may run and bill both; only the one recorded is
//     read, so nothing is applied twice.
//   - while polling: polls are reads; the next holder polls on.
//   - half-way through applying results: each chunk of results is
//     recorded with its items settled in one transaction, so the next
//     holder reads the results again and applies only what was not
//     settled; a result applied twice changes nothing.
//
// Before each create, the submitter renews its lease and bounds the call
// by half of it, so that a submitter paused past its lease does not send
// a batch its successor sends too; the duplicate check above is the
// backstop.
//
// # Limits
//
// What a gather claims (at most 50,000 jobs) is grouped by model and split
// into batches within the provider's limits and Config.Limits: requests
// and bytes per batch (each request counted as its body plus 256 bytes of
// envelope), and the tokens all the pool's open batches may hold
// (Limits.MaxEnqueuedTokens, OpenAI's enqueued-token limit; a job's
// EstimatedTokens, or a quarter of its request's bytes). A request alone
// over the byte limit fails its job permanently; jobs past the token limit
// wait for the open batches to end. A gather claims only as many jobs as
// the room the open batches leave holds at their average tokens a
// request, and none when there is no room, so a long wait on the limit
// does not write a snoozed attempt per job at every gather; a job claimed
// past the room all the same (the first gather, or requests larger than
// the average) is snoozed until the next. A batch is never sent over a
// limit.
//
// # Operators
//
// Operator lists submissions with their counts and cancels one: the
// submitter cancels the provider batch at its next poll, and the jobs the
// provider did not answer return to waiting.
package providerbatch
