// Package anthropic puts calls made with the official Anthropic Go SDK
// (github.com/anthropics/anthropic-sdk-go/v2) under llmq's retries,
// admission and attempt history. Hosts whose job handlers call Anthropic use
// it, as does providerbatch (Batches, for Message Batches).
//
// It gives client options that turn the SDK's retries off and report every
// response (with its anthropic-ratelimit-* headers) to admission, usage
// recorded for the attempt, and each failure classified for the lease
// runner.
//
// # Use
//
// Build the client with Options, after the host's own options, and make
// each provider call inside Call, with the context Call gives:
//
//	opts, err := llmqanthropic.Options(llmqanthropic.Config{})
//	client := anthropic.NewClient(append([]option.RequestOption{option.WithAPIKey(key)}, opts...)...)
//	...
//	answer, err := llmqanthropic.Call(ctx, func(ctx context.Context) (*anthropic.Message, error) {
//		return client.Messages.New(ctx, params)
//	})
//	if err != nil {
//		return nil, err // already says how the attempt ended
//	}
//
// # Routes
//
// For a kind with a route (lease.Route), NewClient builds a candidate's
// Adapter: a *Client is the SDK's client built with Options, and the
// handler finds it through lease.CandidateOf(ctx).Adapter and asks the
// candidate's Model inside Call. How Call classifies a failure decides
// whether the attempt moves to the next candidate (lease.Route.MoveOn).
//
// # Guarantees
//
//   - Retries off: option.WithMaxRetries(0). One Call with one SDK call
//     sends at most one HTTP request; llmq's runner owns retries, so every
//     request the provider sees is an attempt in the job's history, under
//     one admission permit.
//   - Every response reaches admission before the SDK reads it further:
//     inside an attempt under lease.Admission through lease.Responded
//     (the attempt's pool: rate-limit headers lower what the limiter
//     grants, a 429's Retry-After cools the pool for every process);
//     elsewhere through admission.Observe on Config.Limiter and
//     Config.Pool, when set. A 2xx answer is read in full first, so one
//     whose body is lost is not reported as answered; a file's content (a
//     batch's results, served as application/octet-stream or JSONL) is
//     passed on unread, for the caller to read as it comes.
//   - The usage a 2xx answer reports is recorded for the attempt
//     (lease.RecordUsage), whatever the endpoint; see Usage for the fields.
//     A streamed answer (text/event-stream) is the caller's to read: record
//     its final usage with lease.RecordUsage.
//   - The error Call returns says how the attempt ended (next section).
//     The SDK's own error stays reachable through errors.As, except in a
//     snooze (*jobs.SnoozeError has no cause), whose Reason quotes it.
//
// # Classification
//
// "Uncertain" marks the attempt's usage uncertain (it may have been billed
// without its answer reaching the worker); under lease.Admission its
// permit keeps its reservation. "Not sent" wraps the error with
// lease.NotSent: the permit is refunded in full.
//
//	how the call ended                            error returned                     attempt
//	2xx answer                                    nil                                usage recorded
//	2xx the SDK cannot read (not JSON)            jobs.InvalidOutput                 usage recorded if
//	                                                                                   the body reports it
//	429 with a wait (retry-after-ms,              *jobs.SnoozeError for that wait    uncertain, not counted
//	  Retry-After, an exhausted budget's reset)
//	429 without a wait                            the SDK's error (transient)        uncertain, counted
//	408, 409, 5xx                                 jobs.RetryAfter(Retry-After)       uncertain
//	400 "prompt is too long"                      jobs.Permanent wrapping            fails the job, or moves
//	                                              lease.ErrContextWindow             a routed attempt on
//	other 4xx                                     jobs.Permanent                     fails the job
//	timeout, lost connection, lost body after     the error (transient)              uncertain
//	  the request's headers were written
//	never sent: refused or failed dial, name      lease.NotSent (transient)          not uncertain
//	  lookup, context over before sending, a
//	  request the SDK could not build
//
// What can be known about "sent": with net/http's transport an
// httptrace.ClientTrace says whether the request's headers were written;
// a failure before that is not sent, one after it is uncertain (a
// provider may act on a request whose answer is lost). With a transport
// that does not trace, only a failed dial or name lookup counts as not
// sent. A timeout is therefore uncertain once the request went out, and
// not sent when it expired while connecting. The SDK returns the
// context's own error when the context ends mid-call, losing the
// transport's; Call keeps its own record of the request, so the
// classification does not depend on which error the SDK returned. A Call
// whose requests the middleware never saw (a client built without
// Options, or fn not passing on the context Call gives it) is uncertain,
// never not sent: nothing shows that it did not reach the provider.
//
// Decisions: 408 and 409 are treated as 5xx (the SDKs' own retry set);
// a 429 is uncertain, as lease.Admission settles it; fn should make only
// SDK calls, since Call classifies any error fn returns as the call's.
//
// A 2xx answer whose body is lost is not reported to admission at all:
// under lease.Admission that would settle the permit as answered and
// refund tokens the provider may have counted; its rate-limit headers are
// lost with it.
//
// # Batches
//
// Batches is Anthropic's Message Batches API as a providerbatch.Provider,
// and Messages the Messages API's codec for providerbatch.NewCall: a
// kind's call declared once serves a lease.Runner (through Call) and a
// providerbatch.Submitter alike, at the batch price.
//
//	var extract = providerbatch.NewCall(Extract, llmqanthropic.Messages{}, buildExtract, parseExtract)
//	batches := llmqanthropic.NewBatches(client, llmqanthropic.BatchesConfig{}) // client built with Options
//
// A batch is one create call holding up to 100,000 requests and 256 MB,
// each request's params the body Messages.Encode made, sent as encoded
// (the SDK's params type is not used to re-encode it: its decoder drops
// fields it does not know and takes a string or an array as empty
// params). A body without a model, max_tokens or messages fails Create,
// naming its custom_id, before anything is sent. Messages.Encode refuses a
// request that sets WorkspaceID or UserProfileID: they are headers, and a
// batch request carries none; set them on the batch client.
//
// Status is "in_progress", "canceling" or "ended"; a Message Batch never
// fails as a whole once created. Results reads the batch's JSONL results
// itself, line by line (ParseResultLine), rather than through the SDK's
// ResultsStreaming, whose stream stops at the first line it cannot
// decode: a line that cannot be read is passed on with Result.Problem
// and the read goes on. An "errored" result is decided as its error type's
// HTTP status would be on the synchronous path: invalid_request_error
// (400), authentication_error (401), billing_error (402),
// permission_error (403), not_found_error (404) and request_too_large
// (413) refuse the request (terminal); rate_limit_error (429), api_error
// (500), timeout_error (504), overloaded_error (529) and any type llmq
// does not know fail it (retried). "expired" and "canceled" results return
// their jobs to waiting without counting an attempt.
//
// A client built with Options reads a 2xx answer in full before the SDK
// sees it (see Guarantees), but not a file's content: a batch's results
// are read as they come.
//
// Crash safety rests on a match by shape rather than a tag. A Message
// Batch keeps no metadata and echoes nothing llmq sends it (its requests'
// custom_ids can be read only from its results, once it ended). A
// submitter killed after Anthropic created a batch and before the
// submission recorded its id, or whose create's answer was lost after the
// request went out (a timeout, a reset connection), leaves the submission
// "preparing"; the next holder lists the workspace's batches created
// since the submission was recorded and adopts the one of its size that
// no submission of the pool recorded (Find). If several match, it cannot
// tell which (providerbatch.ErrCannotFind) and sends the submission
// again: Anthropic runs, and bills, both batches. Only the one recorded is
// read; nothing is applied twice, but those requests may be paid for
// twice. Give each pool a workspace of its own and the match is exact.
package anthropic
