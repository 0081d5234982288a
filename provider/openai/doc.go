// Package openai puts calls made with the official OpenAI Go SDK
// (github.com/openai/openai-go/v3) under llmq's retries, admission and
// attempt history. Hosts whose job handlers call OpenAI, or a server that
// speaks its API, use it, as does providerbatch (Chat, for the Batch API).
//
// It gives client options that turn the SDK's retries off and report every
// response to admission, usage recorded for the attempt, and each failure
// classified for the lease runner.
//
// # Use
//
// Build the client with Options, after the host's own options, and make
// each provider call inside Call, with the context Call gives:
//
//	opts, err := llmqopenai.Options(llmqopenai.Config{})
//	client := openai.NewClient(append([]option.RequestOption{option.WithAPIKey(key)}, opts...)...)
//	...
//	answer, err := llmqopenai.Call(ctx, func(ctx context.Context) (*openai.ChatCompletion, error) {
//		return client.Chat.Completions.New(ctx, params)
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
//	400 with code context_length_exceeded         jobs.Permanent wrapping            fails the job, or moves
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
package openai
