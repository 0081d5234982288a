// Command demo runs the invoice pipeline end to end in one process, each part
// behind its own HTTP server on loopback: the fake provider (15s mean latency
// scaled down), the API, the worker (lease runner under the admission
// limiter) and the ERP receiver, on one Postgres schema that it recreates.
//
// It submits a large tenant's batch and a small tenant's few invoices,
// including resubmissions with the same key, an idempotency conflict,
// invoices the policy sends to review (wrong IBAN, wrong total, a prompt
// injection), malformed and hung provider answers, quota refusals, and an
// ERP outage window and a provider 429 storm, and three documents uploaded
// again under other names and keys. It prints progress each second and a
// final table, and exits non-zero if an invariant fails: every job finished
// as its document says, every success was booked in the ERP exactly once
// and nothing else was, no completed extraction was run twice, and the
// provider was paid for each distinct document once: paid calls, counted
// from the fake provider's own records of the calls it served, equal the
// distinct documents plus the calls the injected faults caused (its
// malformed answers), the repeated documents taking their results (result
// reuse) instead of being extracted and paid for again.
//
// The job events also leave Postgres through the outbox relay and a broker
// (-broker memory, the in-process default; rabbitmq; kafka, on KAFKA_BROKERS
// or an in-process kfake cluster; none) into an inbox that accepts each
// once. With a broker, that consumer is also what wakes the workers for new
// jobs (Runner.Wake), in place of Postgres NOTIFY; polling stays as the
// fallback.
//
// With -deferrable N, N more of the large tenant's invoices are needed
// two days from now: the service's batch lane sends them through the fake
// provider's Batch API (its batches take 10 minutes divided by -scale),
// and the final table shows each lane's jobs, paid calls and cost from the
// usage ledger; the demo fails unless the batch lane cost half its calls'
// synchronous price (±1%).
//
// With -provider local, the provider's answers take as long as a simulated
// local inference server's engine needs for them (examples/localserver:
// a KV cache of -kv-tokens, continuous batching, preemption), and the
// worker's pool admits by tokens in flight within the same budget.
//
//	go run ./examples/demo [-invoices 300] [-scale 100] [-schema llmq_demo] [-broker memory|rabbitmq|kafka|none] [-provider fake|local] [-deferrable 0]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/internal/sample"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/jobs"
)

type options struct {
	DatabaseURL string
	Schema      string
	Invoices    int // the big tenant's
	Small       int // the small tenant's
	Scale       float64
	RPM         int
	Workers     int
	Outage      time.Duration
	Timeout     time.Duration
	Broker      string // none, memory, rabbitmq or kafka: the path of the job events
	AMQPURL     string
	Provider    string // fake, or local: the fake provider in front of a simulated local server
	KVTokens    int64  // -provider local: the local server's KV cache, and the pool's budget
	Deferrable  int    // the big tenant's invoices that can wait: the batch lane
}

func main() {
	var o options
	flag.StringVar(&o.DatabaseURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"), "PostgreSQL URL")
	flag.StringVar(&o.Schema, "schema", "llmq_demo", "Postgres schema, dropped and recreated")
	flag.IntVar(&o.Invoices, "invoices", 300, "invoices of the large tenant")
	flag.IntVar(&o.Small, "small", 6, "invoices of the small tenant")
	flag.Float64Var(&o.Scale, "scale", 100, "divide the provider's 15s mean latency by this")
	flag.IntVar(&o.RPM, "rpm", 1200, "the provider's requests per minute")
	flag.IntVar(&o.Workers, "workers", 16, "extractions in flight")
	flag.DurationVar(&o.Outage, "erp-outage", 4*time.Second, "how long the ERP is down from the start")
	flag.DurationVar(&o.Timeout, "timeout", 100*time.Second, "give up after this long")
	flag.StringVar(&o.Broker, "broker", "memory", "carry the job events through none, memory (in process), rabbitmq or kafka (KAFKA_BROKERS, else in-process kfake)")
	flag.StringVar(&o.AMQPURL, "amqp-url", envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL for -broker rabbitmq")
	flag.StringVar(&o.Provider, "provider", "fake", "fake, or local: the fake provider's API, quotas and faults in front of a simulated local inference server, whose KV cache sets the latency, and a pool with an in-flight token budget")
	flag.IntVar(&o.Deferrable, "deferrable", 0, "invoices of the large tenant needed two days from now: the batch lane, through the provider's Batch API at half price")
	flag.Int64Var(&o.KVTokens, "kv-tokens", 8000, "-provider local: the server's KV cache in tokens, and the pool's in-flight token budget")
	flag.Parse()
	if o.Provider != "fake" && o.Provider != "local" || o.KVTokens < 1 || o.Deferrable < 0 {
		fmt.Fprintln(os.Stderr, "demo: -provider is fake or local, -kv-tokens positive and -deferrable not negative")
		os.Exit(2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout+30*time.Second)
	_, err := run(ctx, o)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// submission is one document the demo submits, and what must become of it.
type submission struct {
	client    apiClient
	tenant    string
	name      string
	text      string
	invoice   string // the ERP's key: supplier and number
	review    bool
	malformed bool // the provider answers malformed JSON once
	deferred  bool // needed two days from now: the batch lane
	doc       invoice.Document
	jobID     uuid.UUID
}

type demo struct {
	o     options
	s     *stack
	start time.Time
	out   *tabwriter.Writer

	mu         sync.Mutex
	subs       []*submission
	repeats    int // same key, same request: same job (200)
	conflicts  int // same key, another request: 409
	quota429   int
	finishedAt map[uuid.UUID]time.Duration
	watcher    *watcher
	signals    *signals
}

// watcher follows the big tenant's event stream, reconnecting once with
// Last-Event-ID, and checks that no job's state_version goes backwards.
type watcher struct {
	client apiClient

	mu          sync.Mutex
	cancel      context.CancelFunc
	done        chan struct{}
	lastID      string
	events      int
	terminal    int // events announcing a finished job
	reconnected bool
	resets      int
	versions    map[string]int64
	backwards   []string
}

func (w *watcher) start(ctx context.Context) error {
	w.mu.Lock()
	last := w.lastID
	w.mu.Unlock()
	streamCtx, cancel := context.WithCancel(ctx)
	events, err := w.client.stream(streamCtx, last)
	if err != nil {
		cancel()
		return err
	}
	done := make(chan struct{})
	w.mu.Lock()
	w.cancel, w.done = cancel, done
	w.mu.Unlock()
	go func() {
		defer close(done)
		for ev := range events {
			w.mu.Lock()
			switch ev.Event {
			case "reset":
				w.resets++
			case "job.changed":
				w.events++
				w.lastID = ev.ID
				if ev.Data.StateVersion <= w.versions[ev.Data.JobID] {
					w.backwards = append(w.backwards, fmt.Sprintf("%s: %d after %d", ev.Data.JobID, ev.Data.StateVersion, w.versions[ev.Data.JobID]))
				}
				w.versions[ev.Data.JobID] = ev.Data.StateVersion
				if jobs.State(ev.Data.State).Terminal() {
					w.terminal++
				}
			}
			w.mu.Unlock()
		}
	}()
	return nil
}

// reconnect drops the connection and opens a new one from the last event
// seen.
func (w *watcher) reconnect(ctx context.Context) {
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	cancel()
	<-done
	w.mu.Lock()
	w.reconnected = true
	w.mu.Unlock()
	_ = w.start(ctx)
}

// run runs the demo and returns its bill, with an error if an invariant
// failed.
func run(ctx context.Context, o options) (bill, error) {
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return bill{}, err
	}
	defer pool.Close()
	// The demo owns its schema: a fresh one every run.
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgIdent(o.Schema)+" CASCADE"); err != nil {
		return bill{}, err
	}
	cfg := stackConfig{
		Schema: o.Schema, Scale: o.Scale, ProviderRPM: o.RPM, Workers: o.Workers,
		SmallQuota: 2, SystemMax: int64(o.Invoices + o.Small + o.Deferrable + 100), Broker: o.Broker,
		BatchLane: o.Deferrable > 0,
	}
	if o.Provider == "local" {
		cfg.LocalKVTokens = o.KVTokens
	}
	s, err := startStack(ctx, pool, cfg)
	if err != nil {
		return bill{}, err
	}
	d := &demo{o: o, s: s, start: time.Now(), out: tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0), finishedAt: map[uuid.UUID]time.Duration{}}
	defer func() { _ = s.stop() }()
	for tenant, sups := range suppliers {
		for _, sup := range sups {
			if err := s.svc.PutSupplier(ctx, tenant, sup); err != nil {
				return bill{}, err
			}
		}
	}
	latency := fmt.Sprintf("mean 15s / %.0f", o.Scale)
	if s.local != nil {
		latency = fmt.Sprintf("a local server's engine, KV cache %d tokens, times / %.0f", o.KVTokens, o.Scale)
	}
	d.logf("pipeline up: provider %s (%s), API %s, ERP %s; ERP down for the first %s", s.provSrv.URL, latency, s.api.URL, s.erpSrv.URL, o.Outage)
	s.erp.SetDown(true)
	go func() {
		select {
		case <-time.After(o.Outage):
		case <-ctx.Done():
		}
		s.erp.SetDown(false)
		d.logf("ERP back up")
	}()
	go func() {
		select {
		case <-time.After(o.Outage + time.Second):
		case <-ctx.Done():
			return
		}
		d.logf("provider 429 storm for 2s: every worker's pool cools down, the jobs are snoozed, not failed")
		s.provider.Storm(2 * time.Second)
	}()
	if o.Broker != "none" {
		if d.signals, err = startSignals(ctx, s, o.Broker, o.AMQPURL); err != nil {
			return bill{}, err
		}
		defer func() { _ = d.signals.stop() }()
		d.logf("job events leave through the outbox relay and the %s broker into an inbox", o.Broker)
	}
	s.run(ctx)

	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	w := &watcher{client: apiClient{base: s.api.URL, token: bigToken}, versions: map[string]int64{}}
	if err := w.start(watchCtx); err != nil {
		return bill{}, err
	}
	if err := d.submitAll(ctx); err != nil {
		return bill{}, err
	}
	w.reconnect(watchCtx) // mid-run: the stream resumes from Last-Event-ID
	if err := d.wait(ctx); err != nil {
		return bill{}, err
	}
	d.watcher = w
	return d.report(ctx)
}

func (d *demo) logf(format string, args ...any) {
	fmt.Printf("[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
}

// plan lists the documents: the big tenant's batch with its special cases,
// then the small tenant's.
func (d *demo) plan() []*submission {
	big := apiClient{base: d.s.api.URL, token: bigToken}
	small := apiClient{base: d.s.api.URL, token: smallToken}
	var subs []*submission
	for i := range d.o.Invoices {
		sup := suppliers[bigTenant][i%2]
		extra, review := plain, false
		switch {
		case i == 7:
			extra, review = injection, true
		case i%20 == 3:
			extra, review = wrongIBAN, true
		case i%31 == 5:
			extra, review = badTotal, true
		case i%25 == 11:
			extra = malformed
		case i%40 == 17:
			extra = hangs
		}
		number := fmt.Sprintf("%s-%04d", sup.Name[:2], i)
		subs = append(subs, &submission{
			client: big, tenant: bigTenant, name: fmt.Sprintf("big-%04d.txt", i),
			text: sample.Invoice(sup, number, i, extra), invoice: sup.Name + "/" + number, review: review, malformed: extra == malformed,
		})
	}
	// The batch lane: clean invoices needed two days from now.
	for i := range d.o.Deferrable {
		sup := suppliers[bigTenant][i%2]
		number := fmt.Sprintf("%s-L%04d", sup.Name[:2], i)
		subs = append(subs, &submission{
			client: big, tenant: bigTenant, name: fmt.Sprintf("later-%04d.txt", i),
			text: sample.Invoice(sup, number, i, plain), invoice: sup.Name + "/" + number, deferred: true,
		})
	}
	// Duplicate uploads: the same invoices again under other names and
	// keys. They are new jobs, which take the first uploads' results
	// rather than pay for them again; the ERP books each invoice once.
	for i := 0; i < min(3, len(subs)); i++ {
		c := *subs[i]
		c.name = "copy-of-" + c.name
		subs = append(subs, &c)
	}
	for i := range d.o.Small {
		sup := suppliers[smallTenant][0]
		number := fmt.Sprintf("KK-%04d", i)
		subs = append(subs, &submission{
			client: small, tenant: smallTenant, name: fmt.Sprintf("small-%04d.txt", i),
			text: sample.Invoice(sup, number, i, plain), invoice: sup.Name + "/" + number,
		})
	}
	return subs
}

// submitAll uploads and submits every document, eight at a time, honouring
// Retry-After on 429; then resubmits some with their keys (same job) and
// reuses one key for another document (409).
func (d *demo) submitAll(ctx context.Context) error {
	subs := d.plan()
	d.subs = subs
	work := make(chan *submission)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for sub := range work {
				if err := d.submit(ctx, sub); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// The big batch first, then the small tenant's, which must not wait
	// behind it.
	for _, sub := range subs {
		select {
		case work <- sub:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	d.logf("accepted %d jobs, %d of them documents uploaded again under another name (%d answered 429 first and were retried after Retry-After)",
		len(subs), billOf(subs, nil).Repeats, d.quota429)

	// Resubmissions with the same key and request: the same job.
	for _, sub := range subs[:min(10, len(subs))] {
		r, err := sub.client.submit(ctx, "key-"+sub.name, sub.doc)
		if err != nil {
			return err
		}
		if r.Status != http.StatusOK || r.Job.JobID != sub.jobID {
			return fmt.Errorf("resubmitting %s: %d %s, want 200 with job %s", sub.name, r.Status, r.Body, sub.jobID)
		}
		d.repeats++
	}
	// The same key for another document: 409, nothing accepted.
	if len(subs) > 1 {
		r, err := subs[0].client.submit(ctx, "key-"+subs[0].name, subs[1].doc)
		if err != nil {
			return err
		}
		if r.Status != http.StatusConflict {
			return fmt.Errorf("key reused for another document: %d %s, want 409", r.Status, r.Body)
		}
		d.conflicts++
	}
	d.logf("%d resubmissions returned their jobs (200); %d key reused for another document refused (409)", d.repeats, d.conflicts)
	return nil
}

func (d *demo) submit(ctx context.Context, sub *submission) error {
	doc, err := sub.client.putDocument(ctx, sub.name, sub.text)
	if err != nil {
		return err
	}
	sub.doc = doc
	var neededBy time.Time
	if sub.deferred {
		neededBy = time.Now().Add(48 * time.Hour)
	}
	for {
		r, err := sub.client.submitBy(ctx, "key-"+sub.name, doc, neededBy)
		if err != nil {
			return err
		}
		switch r.Status {
		case http.StatusAccepted:
			sub.jobID = r.Job.JobID
			return nil
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			secs, err := strconv.Atoi(r.RetryAfter)
			if err != nil {
				return fmt.Errorf("%s: %d without Retry-After", sub.name, r.Status)
			}
			d.mu.Lock()
			d.quota429++
			d.mu.Unlock()
			select {
			case <-time.After(time.Duration(secs) * time.Second):
			case <-ctx.Done():
				return ctx.Err()
			}
		default:
			return fmt.Errorf("submitting %s: %d %s", sub.name, r.Status, r.Body)
		}
	}
}

// wait prints progress until every job finished and every success reached
// the ERP, or the timeout.
func (d *demo) wait(ctx context.Context) error {
	deadline := time.Now().Add(d.o.Timeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		counts, done, succeeded, err := d.states(ctx)
		if err != nil {
			return err
		}
		erpCounts, err := d.s.erp.Counts(ctx)
		if err != nil {
			return err
		}
		p := d.s.provider.Stats()
		d.logf("jobs %v | provider calls %d (429 %d, hung %d, malformed %d, wrong %d) | ERP receipts %d, booked %d, refused while down %d",
			counts, p.Calls, p.RateLimited, p.Timeouts, p.Malformed, p.Wrong, erpCounts.Receipts, erpCounts.Booked, erpCounts.RefusedDown)
		signalsDone := true
		if d.signals != nil {
			written, pending, accepted, err := d.signals.counts(ctx)
			if err != nil {
				return err
			}
			signalsDone = pending == 0 && accepted == written
		}
		if done == len(d.subs) && erpCounts.Receipts >= int64(succeeded) && signalsDone {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not finished after %s: %d of %d jobs terminal, %d ERP receipts for %d successes", d.o.Timeout, done, len(d.subs), erpCounts.Receipts, succeeded)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// states reads every job's state, notes when each finished, and counts.
func (d *demo) states(ctx context.Context) (counts map[jobs.State]int, done, succeeded int, err error) {
	counts = map[jobs.State]int{}
	for _, sub := range d.subs {
		j, err := d.s.svc.Jobs.Get(ctx, d.s.pool, sub.tenant, sub.jobID)
		if err != nil {
			return nil, 0, 0, err
		}
		counts[j.State]++
		if !j.FinishedAt.IsZero() {
			done++
			if _, ok := d.finishedAt[j.ID]; !ok {
				d.finishedAt[j.ID] = j.FinishedAt.Sub(j.CreatedAt)
			}
		}
		if j.State == jobs.StateSucceeded {
			succeeded++
		}
	}
	return counts, done, succeeded, nil
}

// tenantRow is one line of the final table.
type tenantRow struct {
	jobs, succeeded, review, failed, attempts, snoozed, paid int
	latencies                                                []time.Duration
}

// report prints the final table and checks the invariants, and returns
// the bill.
func (d *demo) report(ctx context.Context) (bill, error) {
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	rows := map[string]*tenantRow{bigTenant: {}, smallTenant: {}}
	lanes := map[bool]*laneRow{false: {}, true: {}} // by deferred
	succeededJobs := map[string]bool{}
	wantBooked := map[string]bool{}
	b := billOf(d.subs, d.s.calls.all())
	for _, sub := range d.subs {
		j, err := d.s.svc.Jobs.Get(ctx, d.s.pool, sub.tenant, sub.jobID)
		if err != nil {
			return bill{}, err
		}
		atts, err := d.s.svc.Jobs.Attempts(ctx, d.s.pool, sub.tenant, sub.jobID)
		if err != nil {
			return bill{}, err
		}
		r, lane := rows[sub.tenant], lanes[sub.deferred]
		r.jobs++
		lane.jobs++
		r.attempts += len(atts)
		r.latencies = append(r.latencies, d.finishedAt[j.ID])
		successes := 0
		for _, a := range atts {
			if a.Usage.InputTokens > 0 {
				r.paid++
				lane.paid++
				lane.in, lane.out = lane.in+a.Usage.InputTokens, lane.out+a.Usage.OutputTokens
			}
			if a.ErrorClass == jobs.ClassInvalidOutput {
				b.InvalidOutput++
			}
			switch a.Outcome {
			case jobs.AttemptSnoozed:
				r.snoozed++
			case jobs.AttemptSucceeded:
				successes++
			case jobs.AttemptReused:
				// A success that took an earlier job's result: no call.
				successes++
				b.Reused++
				lane.reused++
			}
		}
		want := jobs.StateSucceeded
		if sub.review {
			want = jobs.StateReviewRequired
		}
		if j.State != want {
			fail("%s: %s, want %s (%s)", sub.name, j.State, want, j.LastError)
		}
		switch j.State {
		case jobs.StateSucceeded:
			r.succeeded++
			lane.succeeded++
			succeededJobs[j.ID.String()] = true
			wantBooked[sub.tenant+"/"+sub.invoice] = true
			if successes != 1 {
				fail("%s: %d successful attempts, want exactly 1", sub.name, successes)
			}
		case jobs.StateReviewRequired:
			r.review++
		default:
			r.failed++
		}
	}
	invoices, err := d.s.erp.Invoices(ctx)
	if err != nil {
		return bill{}, err
	}
	booked := map[string]int{}
	for _, inv := range invoices {
		booked[inv.Tenant+"/"+inv.Supplier+"/"+inv.InvoiceNumber]++
		if !succeededJobs[inv.JobID] {
			fail("ERP booked job %s, which did not succeed", inv.JobID)
		}
	}
	for k := range wantBooked {
		if booked[k] != 1 {
			fail("invoice %s booked %d times, want once", k, booked[k])
		}
	}
	if len(booked) != len(wantBooked) {
		fail("ERP booked %d invoices, want %d", len(booked), len(wantBooked))
	}
	erpCounts, err := d.s.erp.Counts(ctx)
	if err != nil {
		return bill{}, err
	}
	if erpCounts.Receipts != int64(len(succeededJobs)) {
		fail("ERP accepted %d deliveries for %d successful jobs, want one each", erpCounts.Receipts, len(succeededJobs))
	}
	var streamLine string
	if w := d.watcher; w != nil {
		// Give the stream a moment to deliver the last terminal events.
		deadline := time.Now().Add(5 * time.Second)
		for {
			w.mu.Lock()
			got := w.terminal
			w.mu.Unlock()
			if got >= rows[bigTenant].jobs || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		w.mu.Lock()
		streamLine = fmt.Sprintf("events (SSE, %s): %d job.changed events, %d terminal for %d jobs, reconnected with Last-Event-ID: %v, resets %d, state_version backwards: %d",
			bigTenant, w.events, w.terminal, rows[bigTenant].jobs, w.reconnected, w.resets, len(w.backwards))
		if w.terminal != rows[bigTenant].jobs {
			fail("the event stream showed %d terminal events for %d jobs", w.terminal, rows[bigTenant].jobs)
		}
		for _, b := range w.backwards {
			fail("state_version went backwards: %s", b)
		}
		w.mu.Unlock()
	}
	var signalLine string
	if d.signals != nil {
		// The last webhook deliveries complete just after the ERP counted
		// them, and their completion events are written then: give the
		// relay and the ingress a moment to carry those too.
		var written, pending, accepted int64
		deadline := time.Now().Add(5 * time.Second)
		for {
			var err error
			if written, pending, accepted, err = d.signals.counts(ctx); err != nil {
				return bill{}, err
			}
			if pending == 0 && accepted == written || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		signalLine = fmt.Sprintf("broker (%s): %d job events written to the outbox, %d unpublished, %d accepted once by the inbox\n", d.signals.broker, written, pending, accepted)
		if pending != 0 || accepted != written {
			fail("job events: %d written, %d unpublished, %d accepted", written, pending, accepted)
		}
	}
	if d.quota429 == 0 {
		fail("the small tenant's quota never answered 429")
	}
	laneTable, err := d.laneTable(ctx, lanes, fail)
	if err != nil {
		return bill{}, err
	}
	b.check(fail)

	fmt.Println()
	fmt.Fprintln(d.out, "tenant\tjobs\tSUCCEEDED\tREVIEW_REQUIRED\tother\tattempts\tsnoozed\tpaid calls\tp50 finish\tmax finish")
	for _, tenant := range []string{bigTenant, smallTenant} {
		r := rows[tenant]
		slices.Sort(r.latencies)
		p50, worst := time.Duration(0), time.Duration(0)
		if n := len(r.latencies); n > 0 {
			p50, worst = r.latencies[n/2], r.latencies[n-1]
		}
		fmt.Fprintf(d.out, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", tenant, r.jobs, r.succeeded, r.review, r.failed, r.attempts, r.snoozed, r.paid, p50.Round(10*time.Millisecond), worst.Round(10*time.Millisecond))
	}
	_ = d.out.Flush()
	fmt.Print(laneTable)
	p := d.s.provider.Stats()
	fmt.Printf("\nprovider: %d calls, %d answered, %d rate-limited (429), %d hung, %d malformed, %d plausible but wrong; %d batches, %d batch requests answered\n",
		p.Calls, p.Answered, p.RateLimited, p.Timeouts, p.Malformed, p.Wrong, p.BatchesCreated, p.BatchRequestsAnswered)
	if d.s.local != nil {
		ls := d.s.local.Stats()
		fmt.Printf("local server: %d requests completed, %d preempted, %d abandoned by their clients, KV cache %d tokens\n",
			ls.Completed, ls.Preemptions, ls.Aborted, ls.KVTokens)
	}
	fmt.Printf("API: %d same-key resubmissions answered with their job, %d idempotency conflicts (409), %d quota refusals (429) retried\n",
		d.repeats, d.conflicts, d.quota429)
	fmt.Printf("ERP: %d deliveries accepted, %d invoices booked (%d distinct invoices succeeded), %d requests refused during the outage\n",
		erpCounts.Receipts, erpCounts.Booked, len(wantBooked), erpCounts.RefusedDown)
	fmt.Print(b)
	fmt.Println(streamLine)
	fmt.Print(signalLine)
	fmt.Printf("elapsed: %s\n\n", time.Since(d.start).Round(100*time.Millisecond))
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Println("INVARIANT FAILED:", f)
		}
		return b, errors.New("invariants failed")
	}
	fmt.Println("all invariants hold: every job finished as its document says, review-required results never reached the ERP, every success was booked exactly once, every distinct document was paid for once")
	return b, nil
}

// laneRow is one lane of the cost table: the synchronous one, or the
// batch lane's documents that could wait.
type laneRow struct {
	jobs, succeeded, paid, reused int
	in, out                       int64 // tokens the paid calls reported
}

// laneTable is the cost of each lane as the usage ledger holds it, and
// checks that the batch lane's calls cost half what they would have cost
// synchronously (±1%, the ledger rounds each call to a micro-dollar).
func (d *demo) laneTable(ctx context.Context, lanes map[bool]*laneRow, fail func(string, ...any)) (string, error) {
	limiter, err := admission.NewPostgres(d.s.pool, admission.Config{Schema: d.s.schema})
	if err != nil {
		return "", err
	}
	var cost, batchCost int64
	for _, tenant := range []string{bigTenant, smallTenant} {
		usage, err := limiter.Usage(ctx, tenant, d.start, time.Now())
		if err != nil {
			return "", err
		}
		for _, u := range usage {
			if u.Pool == poolName {
				cost, batchCost = cost+u.Cost, batchCost+u.BatchCost
			}
		}
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nlane\tjobs\tSUCCEEDED\tpaid calls\tinput tokens\toutput tokens\tcost (ledger)\tper paid call")
	for _, l := range []struct {
		name string
		row  *laneRow
		cost int64
	}{{"synchronous", lanes[false], cost - batchCost}, {"batch", lanes[true], batchCost}} {
		per := 0.0
		if l.row.paid > 0 {
			per = float64(l.cost) / float64(l.row.paid)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t$%.4f\t$%.6f\n", l.name, l.row.jobs, l.row.succeeded, l.row.paid, l.row.in, l.row.out, float64(l.cost)/1e6, per/1e6)
	}
	_ = tw.Flush()
	if batch := lanes[true]; batch.jobs > 0 {
		atSync := (float64(batch.in)*inputPrice + float64(batch.out)*outputPrice) / 1e6
		ratio := float64(batchCost) / atSync
		fmt.Fprintf(&b, "batch lane: $%.4f for calls that cost $%.4f at the synchronous price: %.3f×\n", float64(batchCost)/1e6, atSync/1e6, ratio)
		if ratio < 0.495 || ratio > 0.505 {
			fail("the batch lane cost %.3f× its synchronous price, want 0.5× ±1%%", ratio)
		}
		if batch.paid != batch.jobs-batch.reused {
			fail("the batch lane made %d paid calls for %d jobs, %d of which reused a result; want one for each of the others", batch.paid, batch.jobs, batch.reused)
		}
	}
	return b.String(), nil
}

func pgIdent(s string) string { return strconv.Quote(s) }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
