package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/inbox"
)

// ingress publishes -jobs messages to -broker, then times an inbox ingress
// (-workers concurrent batches of up to -claim-batch deliveries, default
// 100) taking all of them into the inbox: receive, accept, commit, ack.
func (b *bench) ingress(ctx context.Context) (float64, error) {
	store, err := inbox.NewStore(inbox.Config{Schema: b.schema})
	if err != nil {
		return 0, err
	}
	batch := cmp.Or(b.o.batch, inbox.DefaultIngressBatch)
	var (
		pub  broker.Publisher
		cons broker.Consumer
	)
	switch b.o.broker {
	case "rabbitmq":
		r, err := b.newRabbitBench()
		if err != nil {
			return 0, err
		}
		defer func() {
			if err := r.close(b.o.keep); err != nil {
				fmt.Fprintf(b.progress, "llmq bench: deleting %s: %v\n", r.queue(), err)
			}
		}()
		p, err := r.publisher(ctx, b.o.window)
		if err != nil {
			return 0, err
		}
		defer func() { _ = p.Close() }()
		c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{
			ConnConfig: rabbitmq.ConnConfig{URL: r.url, Name: "llmq-bench-ingress"},
			Queue:      r.queue(),
			Prefetch:   min(max(2*b.o.workers*batch, rabbitmq.DefaultPrefetch), rabbitmq.MaxPrefetch),
		})
		if err != nil {
			return 0, err
		}
		defer func() { _ = c.Close() }()
		pub, cons = p, c
	default:
		mem := memory.New(memory.Config{})
		defer func() { _ = mem.Close() }()
		pub, cons = mem.Publisher(), mem.Consumer("bench")
	}
	msgs := b.benchMessages(b.o.jobs)
	for start := 0; start < len(msgs); start += 1000 {
		if err := pub.Publish(ctx, msgs[start:min(start+1000, len(msgs))]); err != nil {
			return 0, err
		}
	}
	fmt.Fprintf(b.progress, "llmq bench: %d messages published; ingress with %d concurrent batches of up to %d\n", b.o.jobs, b.o.workers, batch)

	counted := &ackCounter{Consumer: cons}
	noop := func(context.Context, pgx.Tx, broker.Message) error { return nil }
	in, err := store.NewIngress(b.pool, counted, inbox.IngressConfig{Consumer: "bench", Handler: noop, MaxBatch: batch, Concurrency: b.o.workers})
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- in.Run(runCtx) }()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	lastReport := time.Now()
	for counted.acked.Load() < int64(b.o.jobs) && ctx.Err() == nil {
		<-tick.C
		if time.Since(lastReport) >= time.Second {
			lastReport = time.Now()
			fmt.Fprintf(b.progress, "llmq bench: %d of %d messages in the inbox\n", counted.acked.Load(), b.o.jobs)
		}
	}
	elapsed := time.Since(start).Seconds()
	stop()
	if err := errors.Join(<-done, ctx.Err()); err != nil {
		return 0, err
	}
	var n int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.schema+".inbox").Scan(&n); err != nil {
		return 0, err
	}
	if n != b.o.jobs {
		return 0, fmt.Errorf("llmq bench: the inbox holds %d of %d messages", n, b.o.jobs)
	}
	return elapsed, nil
}

// ackCounter counts the deliveries acknowledged, which the ingress does
// only after their transaction committed.
type ackCounter struct {
	broker.Consumer
	acked atomic.Int64
}

func (c *ackCounter) Receive(ctx context.Context) (broker.Delivery, error) {
	d, err := c.Consumer.Receive(ctx)
	if err != nil {
		return nil, err
	}
	return countedDelivery{Delivery: d, acked: &c.acked}, nil
}

type countedDelivery struct {
	broker.Delivery
	acked *atomic.Int64
}

func (d countedDelivery) Ack(ctx context.Context) error {
	err := d.Delivery.Ack(ctx)
	if err == nil {
		d.acked.Add(1)
	}
	return err
}
