// Package kvfeedback keeps a local inference server from queueing and
// preempting when its capacity moves under llmq (another process takes GPU
// memory, a cache fragments, contexts grow longer than planned). Hosts that
// admit calls to their own server (vLLM and the like) through an admission
// pool run its Observer; the budget alone already keeps a server whose
// cache is known from ever preempting.
//
// It adjusts the pool's in-flight token budget
// (admission.Pool.MaxInFlightTokens) from what the server says about
// itself: an Observer reads the server's Prometheus metrics endpoint and
// lowers the budget while the server queues or preempts, raising it back
// slowly when it stops, never above the configured ceiling.
//
//	obs, err := kvfeedback.New(limiter, kvfeedback.Config{
//		Pool: "local-llama", MetricsURL: "http://127.0.0.1:8000/metrics", Ceiling: 200_000,
//		DB: pool, // the observers of the pool take turns: run one in every process
//	})
//	go obs.Run(ctx)
//
// # What it reads
//
// vLLM's metrics, by name (a server that serves several models is read
// for Config.Model only, or summed): vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc (or the older
// vllm:gpu_cache_usage_perc), vllm:num_preemptions_total and the sum and
// count of vllm:time_to_first_token_seconds. Waiting, preemptions and
// (when Config.MaxTTFT is set) time to first token decide; running and
// cache usage are reported in each Reading and in the log line of each
// change. The parser reads Prometheus text format, bounded to
// MaxMetricsBytes, and refuses anything else with ErrMalformed.
//
// # The control law
//
// Additive increase, multiplicative decrease, once per Config.Interval
// (2s):
//
//   - Pressure is a reading with requests waiting in the server's queue,
//     or with more preemptions than the last reading, or (with MaxTTFT) a
//     mean time to first token above MaxTTFT over the requests that got
//     their first token since the last reading. A counter that went down
//     (the server restarted) starts a new baseline and is no pressure.
//   - On pressure the budget is multiplied by Decrease (0.7), never below
//     Floor (Ceiling/10).
//   - Without pressure it grows by Increase (Ceiling/20), never above
//     Ceiling.
//   - A reading that fails (the endpoint is down, the page is malformed)
//     changes nothing: the budget stays where it was.
//
// So, with the defaults, one decrease is made good in at most 6 quiet
// readings (12 s: 0.3 of the ceiling at 0.05 a reading), and the lowest
// budget, the floor, in at most 18 (36 s); in general
// ceil((Ceiling - b) / Increase) readings from budget b. Once the server
// is quiet the budget stays at the ceiling: there is no oscillation. When
// the server's real capacity sits below the ceiling for good, the budget
// oscillates below it: each decrease takes away at most 1 - Decrease (30 %)
// of the budget at which pressure appeared, and each increase adds at most
// Increase.
//
// # Guarantees and limits
//
//   - The budget never leaves [Floor, Ceiling], and only the observer's
//     own steps change it (from the pool's current value, read each
//     time, so a budget an operator set by hand is the starting point).
//   - The budget bounds what llmq admits, not what the server runs: other
//     clients of the same server are pressure too, and lower llmq's share.
//   - With Config.DB, one observer of a pool applies the control law at a
//     time: each reading first takes or renews the pool's lease (a row of
//     admission_observer_leases, migration 0018, never the pool row the
//     grant cycles lock), and an observer that does not hold it reads
//     nothing and returns a Reading with Standby set. Run frees the lease
//     when it returns, so a standby takes over at its next reading; a
//     holder that dies is replaced when its lease (3×Interval) lapses. An
//     observer that takes over starts its counters' baseline again, so
//     only a queue counts as pressure in its first reading. The lease
//     costs one short statement per reading on DB, on a connection
//     borrowed for it, and none between readings.
//   - The lease is not a fence on the change itself: a holder paused for
//     longer than Lease between renewing it and writing the budget may
//     apply one step after another observer took over. Either step is
//     within [Floor, Ceiling], and the next readings correct it.
//   - Without Config.DB, run exactly one observer per pool: two would each
//     apply their steps, and a decrease would count twice. With the
//     Postgres limiter the budget is the pool row's, so every process
//     sees the observer's changes.
package kvfeedback
