// Package console is llmq's operator web console: an http.Handler that a
// host mounts behind its own authentication to see, at a glance, whether
// its jobs are healthy and why one is where it is. Operators use its
// server-rendered pages (html/template, one small embedded script and
// stylesheet, no build step) on the health, jobs, tenants, dead letters,
// provider pools, provider batches, result reuse and schedules of one llmq
// schema.
//
//	h, err := console.New(console.Config{
//		DB:       pool,                // *pgxpool.Pool on the llmq schema's database
//		BasePath: "/ops/console",
//		// Actions are off unless asked for, and need to know who acts:
//		EnableActions: true,
//		Actor: func(r *http.Request) string { return currentUser(r).Email },
//	})
//	mux.Handle("/ops/console/", requireOperator(h))
//
// `llmq console -addr 127.0.0.1:8080` serves it against DATABASE_URL and
// -schema, like the other commands (-tenant, -actions, -actor, -refresh,
// and -trusted-origins and -secure-cookie behind a reverse proxy).
//
// # Pages
//
//   - Overview: first a Health section grading each figure ok, warning
//     (amber) or critical (red), the state written as a word beside the
//     colour, against Config.Health (see Health thresholds below): per
//     queue its depth (runnable jobs), the age of its oldest runnable job
//     and its failure rate over the last hour (failed and retry_scheduled
//     attempts over the attempts that ran, released and snoozed ones
//     excepted, as the LlmqFailureRateHigh alert counts them: read from
//     job_attempts' primary key for the newest jobs accepted in the last
//     two hours, at most 5,000 attempts a refresh, the page saying when
//     the rate is of that sample); the dead letters (FAILED_TERMINAL, with
//     those of the last hour from the chart's counts) and the review
//     backlog (REVIEW_REQUIRED), counted as the dead-letter tabs count
//     them; on an operator's console, the outbox's backlog and lag with the
//     relay's leader lease (events waiting while no relay holds a live
//     lease are critical, whatever their age) and the retention service's
//     lease, holder and last pass (retention_lease.last_pass_at). A
//     tenant's console grades the tenant's own figures only and shows no
//     system service. Then live work by queue (runnable, scheduled,
//     running, oldest
//     runnable job), jobs finished per minute over the last hour by
//     terminal state (an inline SVG chart with a y scale, gridlines at its
//     peak and half of it, and UTC time labels every ten minutes and at
//     the last minute; each minute's count per state
//     stops at DefaultChartCap, 5,000, and is then shown as "5,000+" in the
//     bar's title, the totals and the peak: a refresh reads at most
//     60 × 3 × 5,000 index entries), the outbox's unpublished
//     backlog and publication lag, the workers holding live leases, the
//     holders of admission permits, and the outbox relay's and the
//     retention service's leases.
//   - Tenants: per queue and tenant, its state (running, backlog: runnable
//     jobs waiting, scheduled: only jobs due later, or idle), the backlog,
//     running jobs against the cap, the weight and the oldest runnable
//     job, largest backlog first; below, each tenant once with its jobs
//     accepted (and finished) in the last hour, over all its queues. Idle
//     rows (no waiting or running job) are hidden unless "show idle rows"
//     is ticked (?idle=1); the page says how many it hid. The tenant
//     filter matches any part of the name in any case ("acm" finds
//     "ACME"; % and _ are taken literally). A page reads 100 (queue,
//     tenant) rows in key order, within Config.ScanLimit rows of
//     tenant_queues, and sorts those: "Next tenants" continues.
//   - Jobs: filtered by queue, kind, tenant, state and creation time, newest
//     first, with cursor pagination. A job's page shows its attempt
//     timeline (outcome, class, fence, worker, duration, the route
//     candidate and model that served it with the calls that moved on
//     before it, tokens, uncertain),
//     its durable steps (which attempt ran each, which reused it), its
//     outbox events, its result or error, and its replay lineage. A job
//     enqueued with jobs.Reuse shows its reuse key, its scope (shared by
//     every tenant, or the tenant's own) and its TTL, with a link to the
//     kind's invalidations; one that took an earlier job's result
//     (Job.ReusedFrom) says "reused the result of" that job, and its
//     attempt reads as reused in the timeline, naming the same source
//     (see Decisions for a source the console does not show).
//   - Dead letters and review: FAILED_TERMINAL and REVIEW_REQUIRED jobs,
//     most recently finished first, a job already replayed (a job's
//     replay_of points to it) tagged "replayed"; each tab shows its
//     count (every tenant's, up to Config.CountCap; on a tenant's console
//     the tenant's among the latest Config.ScanLimit of the state) and
//     keeps the page's filters. A job's page offers the replay above
//     everything else, saying when the job was replayed before, and
//     collapses an error longer than 600 bytes into a <details>.
//   - Errors: a job's last error is shown (on its page and in listings)
//     only when it is not SUCCEEDED; a succeeded job's attempts still show
//     each attempt's error. A lease is shown only for a job that is not
//     finished.
//   - Admission: each provider pool's buckets, in-flight permits, cooldown
//     and limits (editable with actions on), usage and cost per tenant
//     per day over two weeks (a chart, ten tenants a page), and the route
//     candidates of the last hour (jobs.PostgresStore.CandidateStats, what
//     `llmq stats` shows as routes): per candidate and model, the attempts
//     that ended on it by outcome, its calls that moved on by failure, and
//     the tokens. The store reads the attempts table sequentially for it
//     (no index serves a time window; see jobs/candidates.sql), so it is
//     read on a full load of the page only, never on its refreshes.
//   - Batches: the provider batch submissions of package providerbatch
//     (what `llmq batches list` shows), newest first, filtered by pool:
//     each one's id, pool, model, state (preparing, submitted, ended), the
//     provider's batch id and status as last polled, its requests and how
//     many have settled (succeeded, failed, stale, returned, skipped), its
//     age, whether a cancel was requested and the first line of its last
//     error. With actions on, an open submission has a Cancel button.
//   - Reuse: the operators' invalidations of result reuse
//     (jobs.PostgresStore.InvalidateReuse, what `llmq reuse list` shows),
//     newest first, filtered by kind, ?limit= sizing the page (50, up to
//     500, a "show more" link as on the batches page): each one's id,
//     time, kind, key (or every key), tenant (or every tenant), who
//     recorded it and why. With actions on, a form records one: kind
//     (required), key (empty: every key of the kind), tenant (empty:
//     every tenant's results) and reason, the actor as who. The page it
//     returns to shows what was recorded and how many computed results
//     it covered (the store's count, within the longest TTL).
//   - Schedules: every periodic job (package schedule, what `llmq
//     schedules list` shows) with its cron or interval, zone, kind,
//     queue, tenant, source, state, next slot and last slot with a link
//     to its last job; a tenant's console lists only the schedules whose
//     jobs are the tenant's. With actions on, each has Pause or Resume
//     (a resumed schedule skips the slots missed while paused); a
//     tenant's console acts only on its own, another's reads as none.
//
// Times are UTC: the time filters are labelled so and read an HTML
// datetime-local value as UTC. Numbers are written one way, with
// thousands separators. Costs and prices are in units of the pools' price
// currency (the usage ledger and the pools store micro-units of it, see
// admission.Pool's InputPrice), with two decimals. The usage chart's bars
// name their day, tenant and value; the attempt timeline labels each
// attempt with its outcome and duration, its bar at least 0.8% of the
// width so that a millisecond attempt beside a long retry delay shows.
//
// Pages refresh their live parts without a reload: the script polls the
// page's own URL with ?fragment=NAME every Config.RefreshInterval (5s)
// while the tab is visible and swaps the part in.
//
// # Health thresholds
//
// A figure is at a level when it is at or above that level's threshold;
// Config.Health's zero fields mean these defaults, chosen to agree with
// deploy/monitoring/alerts.yml where it measures the same thing, so the
// console turns amber about when a warning alert would fire:
//
//   - Oldest runnable job: warning from 5 minutes, critical from 30
//     (LlmqQueueBacklogOld's warning and critical). Depth alone is not
//     graded: a deep queue that drains fast is healthy, and its age says
//     when it is not.
//   - Failure rate: warning from 10%, critical from 25% (LlmqFailureRateHigh
//     fires above 25%), graded only once the queue had 10 failed attempts
//     in the hour (FailureMinFailures), as the alert asks for one a minute:
//     one failure of a quiet queue's two attempts is not 50% worth a red.
//   - Dead letters: graded by those of the last hour, not by the size of
//     the set, which keeps every dead letter until retention prunes it and
//     so would stay amber after the cause is fixed: warning from 1 (a job
//     was lost to a failure someone should look at), critical from 10
//     (LlmqDeadLettersGrowing fires above 10 an hour). The size is shown
//     beside it.
//   - Review backlog: warning from 1 (a person is needed), critical from
//     100 (the reviewers are not keeping up).
//   - Outbox lag: warning from 2 minutes (LlmqOutboxLagHigh), critical from
//     10 (LlmqOutboxNotPublishing's ten minutes), and critical whenever
//     events wait and no relay holds a live leader lease
//     (LlmqOutboxNoActiveRelay): nothing will publish them.
//   - Retention: warning when its last pass is 15 minutes old (passes run
//     every minute by default and a dead holder's lease lapses after 3, so
//     a quarter hour means it is not running), or when it never ran and
//     nobody holds its lease. The lease row does not record the holder's
//     interval, so the threshold is a setting rather than 2× the interval.
//     Retention has no critical level: a late prune harms nothing at once.
//
// New refuses a negative threshold, a failure rate above 1 and an amber
// above its red (defaults filled in first), naming the field
// (Health.OldestRunnableAmber, ...).
//
// # Guarantees
//
//   - Read-only by default. Without Config.EnableActions every write
//     endpoint answers 403 and no page carries a form that writes. With it,
//     the console writes only through the packages' public APIs:
//     jobs.Store.Replay, jobs.PostgresStore.InvalidateReuse,
//     admission.Postgres.SetPool and providerbatch.Operator.Cancel.
//   - Tenant scoping. With Config.Tenant set, every statement the console
//     runs is restricted to that tenant (its jobs through the tenant's own
//     key ranges, its usage rows, its tenant_queues rows): another tenant's
//     job is "not found" (404) exactly like a job that does not exist, a
//     filter naming another tenant is refused (403), and replaying another
//     tenant's job finds nothing. Shared infrastructure, which carries other
//     tenants' activity (provider pools' live state, provider batches,
//     workers, relays, the outbox), is not shown (the batches page says so
//     and leaves the navigation), and pools and batches cannot be changed
//     (403). The reuse page lists the tenant's invalidations and those
//     of every tenant, never another tenant's, and invalidates only the
//     tenant's results: the form's tenant is fixed to it, a form without
//     one is narrowed to it (never widened to every tenant) and one naming
//     another tenant is refused (403) before anything is written. Without
//     Tenant the console is an operator's: every tenant's data.
//   - CSRF protection. Every action is a POST carrying a token that is the
//     HMAC (Config.CSRFKey, random per process by default) of a random,
//     HttpOnly, SameSite=Strict cookie the console set; a missing or
//     mismatched token or cookie, a request the browser labels other than
//     same-origin (Sec-Fetch-Site: cross-site or same-site) or, from a
//     browser that sends no Sec-Fetch-Site, an Origin whose host is not the
//     request's Host and not in Config.TrustedOrigins, is refused with 403
//     before anything is read or written (net/http's
//     CrossOriginProtection). Behind a reverse proxy that rewrites Host,
//     current browsers work as they are; list the public origin in
//     TrustedOrigins for older ones. The cookie is Secure when the console
//     serves TLS itself or Config.SecureCookie is set, which a host behind
//     a TLS-terminating proxy should do. Pages are sent with a
//     Content-Security-Policy allowing only the console's own script and
//     stylesheet, X-Frame-Options DENY and Cache-Control no-store.
//   - Actions are recorded with who and why. Who is Config.Actor(r), the
//     name the host's authentication established; an action without one is
//     refused (403). A replay needs a reason; both are stored on the new job
//     (replayed_by, replay_reason) by jobs.Store.Replay, which leaves the
//     dead job unchanged and is idempotent per job: a repeated submission
//     (a double click, a retried request) returns the first replay, and only
//     ticking "again" makes another. A pool change is logged (Config.Logger)
//     with the actor and the new limits; the pool row keeps no history. A
//     batch's Cancel does what `llmq batches cancel` does (the pool's
//     submitter cancels the provider batch at its next poll, and the jobs
//     the provider did not answer return to waiting) and is logged with
//     the actor and the submission; an unknown or ended submission is a
//     404, and asking again is harmless. An invalidation stores the actor
//     and the reason in its row (invalidated_by, reason), as `llmq reuse
//     invalidate -by -reason` does, and is logged with them, its scope and
//     the count it covered; it changes no job, and recording it again only
//     adds a later cut.
//   - Static files by exact name. /static/ serves the embedded
//     console.css and console.js under exactly those names and nothing
//     else (404): no listing, no other embedded file, whatever the
//     path's escapes.
//   - Data never changes a link's path. Every path segment built from
//     data (job, submission and pool ids and names) is escaped
//     (url.PathEscape), so a pool named "x/../../jobs/ID/replay" is one
//     segment and its form posts to that pool; a name a browser resolves
//     as a dot segment even escaped ("." or "..") gets no form, and the
//     handler refuses it (400).
//   - Bidirectional isolation. Text from the data (tenants, kinds, queues,
//     errors, names) sits in table cells styled unicode-bidi: isolate or in
//     <bdi> elements, so a right-to-left override (U+202E and the like)
//     reorders nothing outside its own value; a job's payload and result
//     show such controls as the JSON escapes they equal (\u202e).
//   - Long values never widen a page: the listings lay their columns out
//     fixed and clip long names and errors with an ellipsis, the full
//     value (errors up to 1,000 characters) in the cell's title; other
//     cells wrap anywhere.
//   - Bad input is refused with 400 and a message naming the field (state,
//     queue, kind, tenant, from, to, limit, before, at, after, after_queue,
//     after_tenant, pool, id, fragment, reason, rpm, key, recorded,
//     covered, proof, ...), before any statement runs with it. Every query
//     and form parameter, known or not, must be valid UTF-8 without NUL
//     and at most 4,096 bytes.
//   - Bounded cost. Every page answers from index reads whose size does not
//     grow with history: counts stop at Config.CountCap (shown as "10,000+"),
//     listings read at most Config.ScanLimit rows per request and then offer
//     to continue from where they stopped, and nothing counts a whole table.
//     The live counts (runnable, scheduled, running) walk the (tenant,
//     queue, priority) prefixes of the indexes on live jobs that hold work
//     (a loose index scan, one probe each, at most Config.CountCap of them)
//     and count each prefix's due or future entries as an index range, so
//     a backlog scheduled for later costs nothing to count past the cap.
//     queries.sql gives each statement's index reasoning; a plan test checks
//     that no generic plan scans jobs, job_keys, job_attempts, the outbox or
//     the usage ledger whole, and runs the counting statements with real
//     values under EXPLAIN ANALYZE on a backlog of 100,000 jobs scheduled
//     for tomorrow, checking that the entries they read stay within a few
//     times the cap. Measured with 1,000,000 jobs (BenchmarkPages),
//     every page answers well within 150 ms of server time.
//   - A schema without the tables a page reads, never migrated or not to
//     the version the page needs (the batches page's came with migration
//     0023, the reuse page's with 0025), is a 500 whose message names the
//     schema, Config.Schema and the fix (llmq.Migrate, `llmq migrate up`),
//     the same on every page and action (llmqtype.NotMigratedError), not
//     a bare "relation does not exist" in the log.
//
// # Tests
//
// The handler tests run against PostgreSQL (a schema per test). The
// browser tests drive Debian's chromium headless through chromedp: every
// page loads without a console error (CSP violations included) and
// refreshes its live parts, a filter, a replay, a batch's cancel and a
// reuse invalidation work through the forms, 100-character names and
// 10 KB errors keep every page within the window's width and the listings
// at a sane height, and each page's screenshot is written to the test's temp dir or to $LLMQ_CONSOLE_SCREENSHOTS.
// Chromium is a test dependency like PostgreSQL: scripts/services (make
// test's first step) installs it when missing, and without it the browser
// tests fail saying how to get it (LLMQ_CHROMIUM names another binary;
// LLMQ_SKIP_BROWSER=1 skips them on purpose, saying so).
//
// # Decisions
//
//   - Listings are ordered by job id (UUIDv7, so by acceptance time), and the
//     time filter is an id range: the primary key and job_keys' (tenant, id)
//     serve every filter, with the scan limit keeping rare filters cheap.
//     Dead letters and reviews are ordered by finish time through
//     jobs_finished_idx; one tenant's walk its keys instead.
//   - A job's events are found in the outbox's primary-key range between
//     its creation and its end (event ids are UUIDv7), because the outbox
//     deliberately has no index on aggregate_id. The range is read from
//     both ends, 25,000 entries each (DefaultEventScanLimit), so the job's
//     first and latest events are found however busy the outbox was; when
//     the two reads leave a middle unread, the page says the scan limit was
//     reached. Events written in batch rows (outbox.Store.WriteBatch; the
//     job store writes a statement's events that way when it writes more
//     than one) are found in the batch rows written in the job's lifetime,
//     through their creation time, 500 rows from each end (a fiftieth of
//     the scan limit), each row's events read out of it; the page says so
//     when those reads leave a middle unread too. Published events are
//     pruned after their retention, so old
//     jobs show none, and a relay with outbox.RelayConfig.DeletePublished
//     keeps none, so jobs then show only events still waiting.
//   - A tenant-scoped chart counts the tenant's jobs accepted in the last two
//     hours (at most 20,000), read through its keys, rather than visiting
//     every tenant's finished jobs.
//   - The batches page reads through providerbatch.Operator.List, as the
//     CLI does, rather than SQL of its own: newest first through
//     provider_submissions_created_idx, one more than the page to know
//     whether there are more. The list has no cursor, so a page grows (50,
//     then 100, ... up to 500) instead of continuing. A pool filter walks
//     the same index past other pools' submissions: the table holds one
//     row per provider batch (up to 50,000 requests each), so it stays
//     small, unlike the jobs tables the scan limit guards.
//   - The source of a reused job (and of its reused attempt) is read as the
//     console reads any job: on an operator's console it is linked, with
//     its tenant when that is another (a shared key); on a tenant's
//     console, through the tenant's own keys, so a shared key's source
//     computed for another tenant is not found, exactly like a job that
//     does not exist. The page then shows the source's id without a link,
//     saying it may be another tenant's job under the shared key or one no
//     longer kept: the id is the tenant's own job's data (jobs.Store.Get
//     returns it as Job.ReusedFrom), while a link would lead to a 404 and
//     "another tenant's job" would need a read outside the tenant's scope
//     to be sure of. Nothing else of the source is shown; the result the
//     job took is its own. A source retention has pruned shows its id and
//     says so.
//   - The reuse page reads the invalidations with a statement of its own
//     (ReuseInvalidations in queries.sql), since jobs' listing has no
//     tenant filter: the table holds one row per operator action, pruned
//     once no result it covers can be reused, so it stays small whatever
//     the jobs and is read and sorted whole for the page. Pages grow (50,
//     then 100, ... up to 500) as on the batches page.
//   - The count of results an invalidation covered is stored nowhere, so
//     the action's redirect carries it with the invalidation's id and an
//     HMAC of both under Config.CSRFKey: the page shows only a count the
//     console wrote (a link with another is refused, 400), and reads the
//     invalidation itself under the page's tenant rule.
//   - A tenant's invalidation covers the results its own jobs computed,
//     those under a shared key included: other tenants' jobs then compute
//     again rather than take them, and no other tenant's result is ever
//     covered. An operator's invalidation of every tenant is listed on
//     every tenant's console with its author and reason, so such a reason
//     should name no tenant.
//   - The oldest runnable job, per queue on the overview and per (queue,
//     tenant) on the tenants page, is the least available_at among the
//     first entries of the priorities in use, which the loose index scan
//     reads anyway: exact, unless the overview's walk stopped at
//     Config.CountCap prefixes (then its counts show as "N+" and the age as
//     a bound, "≥").
package console
