package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/webhook"
)

// The fault kinds, in the order the summary lists them.
const (
	faultWorkerKill   = "worker-kill"
	faultWorkerStall  = "worker-stall"
	faultConsumerStop = "consumer-stop"
	faultBrokerCut    = "broker-cut"
	faultPGTerminate  = "pg-terminate"
	faultStorm        = "429-storm"
	faultPrimaryOut   = "primary-outage"
	faultTimeouts     = "timeouts"
	faultMalformed    = "malformed"
	faultERPDown      = "erp-down"
)

var allFaults = []string{faultWorkerKill, faultWorkerStall, faultConsumerStop, faultBrokerCut, faultPGTerminate, faultStorm, faultPrimaryOut, faultTimeouts, faultMalformed, faultERPDown}

// faultKinds are the kinds a run injects: all of them, but a broker cut
// only where there is a broker connection to cut.
func (c *controller) faultKinds() []string {
	var kinds []string
	for _, k := range allFaults {
		if k == faultBrokerCut && c.cfg.Broker == brokerPostgres {
			continue
		}
		kinds = append(kinds, k)
	}
	return kinds
}

type scheduled struct {
	at   time.Duration
	kind string
}

// schedule places every kind once at a random time in the first 70% of the
// arrivals, then more faults of random kinds, FaultEvery apart on average,
// up to 80%: the faults run one after another, so a late one still has
// arrivals around it.
func (c *controller) schedule() []scheduled {
	kinds := c.faultKinds()
	d := float64(c.cfg.Duration)
	var out []scheduled
	for _, k := range kinds {
		out = append(out, scheduled{at: time.Duration(d * (0.05 + 0.65*c.rng.Float64())), kind: k})
	}
	extra := int(c.cfg.Duration/c.cfg.FaultEvery) - len(kinds)
	for range max(0, extra) {
		out = append(out, scheduled{at: time.Duration(d * (0.05 + 0.75*c.rng.Float64())), kind: kinds[c.rng.IntN(len(kinds))]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// inject runs the schedule, each fault once its time has come and the one
// before it is over.
func (c *controller) inject(ctx context.Context, schedule []scheduled) {
	for _, f := range schedule {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(c.start.Add(f.at))):
		}
		// A fault that cannot finish (a lock held by a paused process, a
		// child that never answers) must not hold the run forever.
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		what, err := c.fault(fctx, f.kind)
		cancel()
		c.mu.Lock()
		if err != nil {
			c.findings = append(c.findings, fmt.Sprintf("%s at %s not injected: %v", f.kind, c.elapsed(), err))
		} else {
			c.faults[f.kind]++
			c.faultLog = append(c.faultLog, fmt.Sprintf("%8s  %-13s %s", c.elapsed(), f.kind, what))
		}
		c.mu.Unlock()
		if err == nil {
			fmt.Fprintf(c.cfg.Out, "%7s  fault: %s %s\n", c.elapsed(), f.kind, what)
		}
	}
}

// fault injects one fault of kind and says what it did.
func (c *controller) fault(ctx context.Context, kind string) (string, error) {
	rnd := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(c.rng.Float64()*float64(hi-lo)) }
	switch kind {
	case faultWorkerKill:
		return c.killWorker(ctx)
	case faultWorkerStall:
		return c.stallWorker(ctx)
	case faultConsumerStop:
		return c.stopConsumer(ctx)
	case faultBrokerCut:
		d := rnd(1500*time.Millisecond, 3500*time.Millisecond)
		c.cut.Cut()
		if err := sleep(ctx, d); err != nil {
			c.cut.Restore()
			return "", err
		}
		c.cut.Restore()
		return fmt.Sprintf("severed for %s", d.Round(time.Millisecond)), nil
	case faultPGTerminate:
		return c.terminateBackend(ctx)
	case faultStorm:
		d := rnd(time.Second, 3*time.Second)
		c.provider.Storm(d)
		return fmt.Sprintf("every call refused with 429 + Retry-After for %s", d.Round(time.Millisecond)), sleep(ctx, d)
	case faultPrimaryOut:
		// The primary model alone fails, storming (429 with
		// Retry-After) or out (503), while the fallback serves.
		d := rnd(2*time.Second, 4*time.Second)
		if c.rng.IntN(2) == 0 {
			c.provider.StormModel(invoice.Model, d)
			return fmt.Sprintf("%s's calls refused with 429 + Retry-After for %s", invoice.Model, d.Round(time.Millisecond)), sleep(ctx, d)
		}
		c.provider.OutageModel(invoice.Model, d)
		return fmt.Sprintf("%s out (503) for %s", invoice.Model, d.Round(time.Millisecond)), sleep(ctx, d)
	case faultTimeouts:
		n := 1 + c.rng.IntN(3)
		c.provider.HangNext(n)
		return fmt.Sprintf("the next %d calls hang", n), nil
	case faultMalformed:
		n := 1 + c.rng.IntN(3)
		c.provider.MalformNext(n)
		return fmt.Sprintf("the next %d calls answer malformed JSON", n), nil
	case faultERPDown:
		// Longer than the first five steps of the delivery schedule
		// (0, 250ms, 500ms, 1s, 1s) together.
		d := rnd(3*time.Second, 5*time.Second)
		c.erpSrv.down()
		err := sleep(ctx, d)
		c.erpSrv.up()
		return fmt.Sprintf("ERP down for %s", d.Round(time.Millisecond)), err
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// killWorker arms the provider's hook: the next call answered with 200
// gets its worker SIGKILLed as soon as the answer is on the wire, before
// the worker can record it. The controller then plays the supervisor that
// saw the process die: it ends the dead worker's leases and permits (the
// invoice worker's lease is at least 90s, longer than a test may wait) and
// runs a reaper pass, and starts a replacement with a new API key.
func (c *controller) killWorker(ctx context.Context) (string, error) {
	c.killArmed.Store(true)
	var k killRecord
	select {
	case k = <-c.killedCh:
	case <-time.After(20 * time.Second):
		if c.killArmed.CompareAndSwap(true, false) {
			return "", errors.New("no call was answered within 20s")
		}
		k = <-c.killedCh
	case <-ctx.Done():
		c.killArmed.Store(false)
		return "", ctx.Err()
	}
	c.mu.Lock()
	ch := c.keyOwner[k.call.APIKey]
	c.killed = append(c.killed, k)
	c.mu.Unlock()
	select {
	case <-ch.done:
	case <-time.After(10 * time.Second):
		c.violation("%s did not die within 10s of SIGKILL", k.worker)
	}
	// Postgres ends the dead process's backends (rolling back what they
	// held) once it reads their closed sockets; until then a row of its
	// may be locked, and the leases could not be ended.
	if err := c.awaitBackendsGone(ctx, ch); err != nil {
		return "", err
	}
	if _, err := c.pool.Exec(ctx, c.q.Must("ExpireLeases"), k.worker); err != nil {
		return "", err
	}
	if _, err := c.pool.Exec(ctx, c.q.Must("ExpirePermits"), k.worker); err != nil {
		return "", err
	}
	reaped, err := c.svc.Jobs.Reap(ctx, c.pool, jobs.ReapParams{
		Backoff:       llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second},
		BackoffByKind: map[string]llmqtype.BackoffPolicy{webhook.Kind: webhook.Backoff()},
	})
	if err != nil {
		return "", err
	}
	if err := c.startWorker(ch.slot); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s killed after the provider answered %s; reaper took back %+v", k.worker, invoiceNumber(k.call.Document), reaped), nil
}

// awaitBackendsGone waits until no backend of the dead child ch is left.
func (c *controller) awaitBackendsGone(ctx context.Context, ch *child) error {
	name := "chaos-" + c.runID + "-" + ch.cfg.WorkerID
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		if err := c.pool.QueryRow(ctx, c.q.Must("Backends"), name).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d backends of %s were still there 15s after it died", n, ch.cfg.WorkerID)
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
}

// stallWorker arms the provider's hook like killWorker, but the worker
// whose call was answered is paused (SIGSTOP), not killed: a process that
// stalls past its lease (a long GC pause, a frozen VM). Its leases are
// ended as if they had run out while it was paused, the reaper takes its
// jobs back, and the process is resumed (SIGCONT) once another worker has
// finished the job whose answer it holds, or after 15s. Resumed, it
// completes with a fence that is no longer the job's: the attempt must be
// recorded as stale and the result it carries must not replace anything.
func (c *controller) stallWorker(ctx context.Context) (string, error) {
	// A worker paused inside a transaction on the job's row keeps its
	// lease (ExpireLeases skips locked rows); it is resumed and the next
	// answer is tried.
	for range 3 {
		what, taken, err := c.stallOnce(ctx)
		if err != nil || taken {
			return what, err
		}
	}
	return "", errors.New("three paused workers each held their job's row in a transaction")
}

func (c *controller) stallOnce(ctx context.Context) (string, bool, error) {
	c.stallArmed.Store(true)
	var k killRecord
	select {
	case k = <-c.stalledCh:
	case <-time.After(20 * time.Second):
		if c.stallArmed.CompareAndSwap(true, false) {
			return "", false, errors.New("no call was answered within 20s")
		}
		k = <-c.stalledCh
	case <-ctx.Done():
		c.stallArmed.Store(false)
		return "", false, ctx.Err()
	}
	c.mu.Lock()
	ch := c.keyOwner[k.call.APIKey]
	s := c.byNumber(invoiceNumber(k.call.Document))
	c.mu.Unlock()
	resume := func() { _ = ch.cmd.Process.Signal(syscall.SIGCONT) }
	defer resume()
	if _, err := c.pool.Exec(ctx, c.q.Must("ExpireLeasesSkipLocked"), k.worker); err != nil {
		return "", false, err
	}
	if _, err := c.svc.Jobs.Reap(ctx, c.pool, jobs.ReapParams{
		Backoff:       llmqtype.BackoffPolicy{Base: 100 * time.Millisecond, Cap: time.Second},
		BackoffByKind: map[string]llmqtype.BackoffPolicy{webhook.Kind: webhook.Backoff()},
	}); err != nil {
		return "", false, err
	}
	if s == nil {
		return "", false, fmt.Errorf("the paused call's document %q is no submission's", invoiceNumber(k.call.Document))
	}
	// By key: the API's answer may not have reached the load generator yet.
	var state, owner string
	if err := c.pool.QueryRow(ctx, c.q.Must("JobByKey"), tenant, s.key).Scan(&state, &owner); err != nil {
		return "", false, err
	}
	if owner == k.worker {
		return "", false, nil
	}
	c.mu.Lock()
	c.stalled = append(c.stalled, k)
	c.mu.Unlock()
	finished := "did not finish elsewhere within 15s"
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		err := c.pool.QueryRow(ctx, c.q.Must("JobByKey"), tenant, s.key).Scan(&state, &owner)
		if err != nil {
			return "", true, err
		}
		if state != string(jobs.StateRunning) && state != string(jobs.StateReady) && state != string(jobs.StateRetryScheduled) {
			finished = "finished elsewhere as " + state
			break
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return "", true, err
		}
	}
	resume()
	return fmt.Sprintf("%s paused after the provider answered %s, its leases ended; the job %s; resumed", k.worker, invoiceNumber(k.call.Document), finished), true, nil
}

// stopConsumer tells the signals process to hold the next delivery whose
// transaction committed instead of acknowledging it, and then stops its
// consumer there: SIGKILL for RabbitMQ and Kafka (a replacement process
// starts), or closing the consumer for the memory broker, which lives in
// that process. The broker redelivers the message; the inbox must take it
// as a duplicate.
func (c *controller) stopConsumer(ctx context.Context) (string, error) {
	c.mu.Lock()
	ch := c.children["signals"]
	c.mu.Unlock()
	select { // a stale hold from an earlier process
	case <-c.heldCh:
	default:
	}
	if _, err := fmt.Fprintln(ch.stdin, "arm"); err != nil {
		return "", err
	}
	var id string
	select {
	case id = <-c.heldCh:
	case <-time.After(20 * time.Second):
		return "", errors.New("no delivery was committed within 20s")
	case <-ctx.Done():
		return "", ctx.Err()
	}
	c.mu.Lock()
	c.held = append(c.held, id)
	c.mu.Unlock()
	if c.cfg.Broker == brokerPostgres {
		return fmt.Sprintf("consumer closed after committing event %s, before acking it", id), nil
	}
	ch.expected.Store(true)
	_ = ch.cmd.Process.Kill()
	select {
	case <-ch.done:
	case <-time.After(10 * time.Second):
		c.violation("%s did not die within 10s of SIGKILL", ch.cfg.WorkerID)
	}
	if err := c.startSignals(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s killed after committing event %s, before acking it", ch.cfg.WorkerID, id), nil
}

// terminateBackend terminates one backend of a child process that is
// inside a transaction, polling pg_stat_activity until one is.
func (c *controller) terminateBackend(ctx context.Context) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rows, err := c.pool.Query(ctx, c.q.Must("BackendsInTransaction"), "chaos-"+c.runID+"-")
		if err != nil {
			return "", err
		}
		type backend struct {
			pid  int32
			name string
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (backend, error) {
			var b backend
			return b, r.Scan(&b.pid, &b.name)
		})
		if err != nil {
			return "", err
		}
		if len(found) > 0 {
			b := found[c.rng.IntN(len(found))]
			var ok bool
			if err := c.pool.QueryRow(ctx, c.q.Must("Terminate"), b.pid).Scan(&ok); err != nil {
				return "", err
			}
			if ok {
				return fmt.Sprintf("backend %d of %s terminated mid-transaction", b.pid, b.name), nil
			}
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return "", err
		}
	}
	return "", errors.New("no child backend was in a transaction within 10s")
}

// amqpHost parses an AMQP URL.
func amqpHost(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("AMQP URL: %w", err)
	}
	if u.Port() == "" {
		u.Host += ":5672"
	}
	return u, nil
}
