// Package webhook delivers events to the HTTP endpoints tenants register,
// signed so receivers can trust them, and helps receivers accept each
// delivery exactly once.
//
// It owns: endpoints (per tenant, with rotating signing keys, subscribed
// event types and a status), deliveries (one per event and endpoint, each a
// job of Kind run by the lease runner through a Dispatcher), the SSRF-safe
// Client, the per-endpoint circuit breaker shared through Postgres, and the
// receiving side's Verifier and Receiver.
//
//	store, _ := webhook.NewStore(webhook.Config{Jobs: jobStore, Outbox: outboxStore})
//	ep, key, _ := store.RegisterEndpoint(ctx, pool, webhook.EndpointParams{
//		Tenant: tenant, URL: "https://erp.example.com/llmq", EventTypes: []string{"invoice.extract.completed"},
//	}) // show key's secret to the tenant once
//	client, _ := webhook.NewClient(webhook.ClientConfig{})
//	dispatcher, _ := store.NewDispatcher(pool, webhook.DispatcherConfig{Client: client})
//	runner, _ := lease.NewRunner(pool, jobStore, lease.Config{
//		Handlers:    map[string]lease.Handler{webhook.Kind: dispatcher, "invoice.extract": extractor},
//		Queues:      map[string]lease.QueueConfig{"default": {}, webhook.DefaultQueue: {}},
//		RetryByKind: map[string]llmqtype.BackoffPolicy{webhook.Kind: webhook.Backoff()},
//		OnSucceeded: func(ctx context.Context, tx pgx.Tx, job *jobs.Job) error {
//			_, err := store.Enqueue(ctx, tx, job.Tenant, webhook.Event{ID: job.ID.String(), Type: job.Kind + ".completed", Payload: job.Result})
//			return err
//		},
//	})
//
// # Guarantees
//
//   - Deliveries go only to endpoints registered for the tenant and enabled,
//     never to a URL taken from an event. Enqueue runs in the caller's
//     transaction: the deliveries exist if and only if it commits. An event id
//     reaches an endpoint once, however often it is enqueued.
//   - One endpoint's deliveries go out one at a time, in the order they were
//     enqueued (their jobs share the endpoint's group key): a delivery that is
//     retrying holds back the endpoint's later ones, never another endpoint's.
//   - Delivering never re-runs the work that produced the event: deliveries
//     are separate jobs in their own queue, so an endpoint that is down for
//     hours grows a backlog of deliveries, not of extractions.
//   - The delivery id (webhook-id) is fixed when the delivery is created and
//     is the same on every retry and every replay; each attempt signs a fresh
//     timestamp over exactly the bytes it sends. During a rotation every
//     active key signs (several entries in webhook-signature); the key ids
//     are recorded with each attempt and optionally sent in KeyIDHeader.
//   - Every attempt leaves a row: URL, request headers, key ids, status,
//     latency, a bounded response body, outcome and error. Exhausted
//     deliveries are dead-lettered by the job store (FAILED_TERMINAL with
//     their job attempts) and can be replayed with jobs.Replay.
//   - Retry policy: timeouts, connection errors, 408, 425, 429 and 5xx retry
//     on Config.Schedule (raised to a Retry-After); 3xx is a failure
//     (redirects are never followed) and retries; 410 disables the endpoint
//     and stops; 401/403 retry on a schedule AuthSlowdown times slower and
//     raise an AlertAuthFailing outbox event when they reach
//     AuthAlertThreshold in a row; any other 4xx stops at once.
//   - The circuit breaker lives in the endpoint's row, so every dispatcher in
//     every process sees it: BreakerThreshold consecutive failures (no
//     response, 408, 5xx) open it; while open, deliveries are snoozed
//     (jobs.Snooze: not attempted, not counted against their attempts);
//     after BreakerCooldown exactly one dispatcher sends a probe (the row
//     lock decides), whose success closes the breaker and whose failure
//     re-opens it.
//   - The Client resolves names itself, refuses non-public addresses (the
//     IANA special-purpose registries, IPv4-compatible, NAT64, 6to4 and
//     Teredo forms, numeric host spellings such as 2130706433 or 0177.0.0.1;
//     an IPv4-mapped address is judged as the IPv4 address it maps) before
//     dialling, and checks again in the dialer's Control hook, which sees
//     the address the socket connects to, so DNS rebinding cannot slip
//     through.
//     No proxy, no redirects, TLS unless AllowHTTP, bounded response bodies,
//     a timeout per attempt.
//   - Verify compares MACs in constant time (hmac.Equal), enforces the
//     timestamp window in both directions and never accepts a signature of
//     another scheme or over other bytes. Under "t1" it refuses an id
//     holding a '.', which would let the id/body split move. The Receiver bounds the body,
//     verifies, then accepts the delivery id in the inbox and runs the
//     receiver's work in one transaction, answering 2xx only after commit.
//
// # Decisions
//
//   - Signatures follow Standard Webhooks by default (SchemeStandard, "v1"),
//     so receivers can use that specification's libraries; the earlier
//     layout over "timestamp.id.body" is SchemeTimestampFirst, tagged "t1"
//     so that the two can never be confused.
//   - The body is built once at Enqueue, in the Standard Webhooks shape
//     {"type", "timestamp", "data"}, and stored as bytes: every attempt sends
//     the identical body, so a receiver's inbox digest stays the same.
//   - HMAC signing needs each secret in clear, so a secret cannot be stored
//     hashed. With Config.Sealer (NewAESGCMSealer: AES-256-GCM under a key
//     the host keeps outside the database) secrets are stored sealed, bound
//     to their endpoint and key id, and opened only to sign; a dump or a
//     replica of the database then holds no usable secret. Without a
//     sealer they are stored raw, and Store.SealSecrets seals those once a
//     sealer is set. A dispatcher without the sealer fails deliveries whose
//     keys are sealed with ErrSealed, and they are retried on schedule.
//   - A name that resolves to several addresses is refused if any of them is
//     forbidden: a public address next to an internal one is a rebinding
//     attempt, not a configuration.
//   - An IPv4-mapped address (::ffff:a.b.c.d) is unmapped before it is
//     judged, and the socket is given the IPv4 address: it is where a
//     dual-stack socket connects anyway, and it is how Go's resolver answers
//     with every IPv4 entry of /etc/hosts (Docker --add-host, Kubernetes
//     hostAliases). ::ffff:127.0.0.1, ::ffff:10.0.0.1 and every other
//     mapped form of a forbidden IPv4 address are refused like the address
//     itself.
//   - 3xx retries rather than stopping, since a moved endpoint is usually
//     fixed by its owner; 429 does not count towards the breaker (the endpoint
//     is alive and asking for less), 5xx and 408 do.
//   - The breaker defers for the rest of its cool-down (at least MinDefer);
//     deliveries that arrive while a probe is out wait for the probe's
//     attempt timeout, so a dying probe cannot hold the breaker half open.
//   - An attempt cut short by its own runner (shutdown, lost lease) is
//     recorded as ClassInterrupted and does not count towards the breaker;
//     the runner's attempt timeout counts, like the client's, because a slow
//     endpoint is what it measures. Keep the client's AttemptTimeout below the
//     runner's so the client's fires first.
//   - Deliveries and their attempts are kept for Config.Retention (default
//     30 days, at least the schedule's span plus a day) and removed by Prune
//     (or a Pruner batch by batch, as the retention package's service does).
//     Age alone never removes a delivery whose job is waiting, running or
//     retrying, nor one whose job is a dead letter jobs.Replay can replay:
//     no schedule bounds a delivery's life (it waits behind its endpoint's
//     earlier deliveries, and 401/403 slowdowns and Retry-After stretch its
//     attempts), and a replay must find its delivery. Such deliveries go
//     once every job of theirs has succeeded or been pruned by retention.
//   - Garbage in one signature entry is skipped, not fatal: a header may hold
//     several entries and another may match, as in the Standard Webhooks
//     libraries. Timestamps are whole Unix seconds of at most 12 digits.
//   - The receiver answers 400 for missing or malformed headers, 401 for a
//     signature that does not match or a timestamp out of the window, 409 for
//     a delivery id reused with another body (quarantined in the inbox and
//     reported through OnDigestMismatch), 503 when its transaction failed.
//
// # Database connections
//
// A Dispatcher holds no connection of its own between attempts and none
// while a request is out. Each attempt takes one connection from the pool
// for each of its short database steps (loading the delivery with its
// keys, asking an open breaker, recording the attempt in one transaction),
// and the breaker gauge takes one per reading; together they use at most
// DispatcherConfig.MaxConns (default 2) at once, however many deliveries
// the runner runs concurrently: a step beyond that waits for a turn. The
// runner's own connections (claims, heartbeats, completions) are the
// runner's. A Store holds none; its methods use the DBTX they are given. A
// Receiver uses one connection per delivery it accepts, for the length of
// the transaction that holds the inbox record and the receiver's work: its concurrency is the
// HTTP server's, and the host bounds it with the pool's MaxConns.
//
// # Logging
//
// The dispatcher and the receiver log only warnings and errors, through
// their Config's Logger, slog.Default() when none is given: an attempt that
// was made but could not be recorded, a delivery a receiver could not
// accept, a delivery id reused with another body. A Key logged by the host
// (any slog handler), formatted with fmt or marshalled to JSON shows its
// id, never its secret.
//
// # Observability
//
// With DispatcherConfig.MeterProvider the dispatcher reports
// llmq.webhook.attempts ({attempt}; outcome = delivered | retry | failed |
// disabled | deferred, class = the attempt's error class, empty when
// delivered), llmq.webhook.attempt.duration (s; outcome) from sending to
// the answer, and the observable gauge llmq.webhook.breakers ({endpoint};
// state = closed | open | half_open) over enabled endpoints, read at most
// once per GaugeRefresh (default 15s) with one scan of webhook_endpoints
// (one row per registered endpoint). No label names a tenant or an
// endpoint. Dispatcher.Close unregisters the gauge. With
// DispatcherConfig.TracerProvider each attempt that reaches the breaker
// check is a client span "webhook deliver", a child of the runner's attempt
// span, with llmq.webhook.delivery_id, llmq.webhook.endpoint_id,
// llmq.webhook.attempt, http.response.status_code, llmq.webhook.outcome and
// error.type. The trace context is not sent to the endpoint: its trace ids
// are the sender's business. With ReceiverConfig.MeterProvider the receiver
// counts llmq.webhook.received ({delivery}; status = the HTTP status it
// answered).
package webhook
