package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// Put the queues' depth on a MeterProvider: observable gauges read from the
// database at most once per Refresh, whatever the scrape rate. A runner with
// a MeterProvider does this itself while it runs; an API process that runs
// none registers them like this.
func ExamplePostgresStore_RegisterGauges() {
	ctx := context.Background()
	pool, cleanup := dbtest.ForExample(ctx, "llmq_example_gauges") // a pool on DATABASE_URL and a fresh schema
	defer cleanup()
	if _, err := llmq.Migrate(ctx, pool, llmq.MigrateOptions{Schema: "llmq_example_gauges"}); err != nil {
		panic(err)
	}
	store, err := jobs.NewStore(jobs.Config{Schema: "llmq_example_gauges"})
	if err != nil {
		panic(err)
	}
	for _, at := range []time.Time{{}, {}, time.Now().Add(time.Hour)} {
		if _, err := store.Enqueue(ctx, pool, jobs.EnqueueParams{Tenant: "acme", Kind: "invoice.extract",
			Payload: json.RawMessage(`{}`), AvailableAt: at}); err != nil {
			panic(err)
		}
	}

	// Any SDK reader works: a Prometheus exporter in a server, a manual
	// reader here.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	reg, err := store.RegisterGauges(pool, jobs.GaugeConfig{MeterProvider: mp, Refresh: 15 * time.Second})
	if err != nil {
		panic(err)
	}
	defer func() { _ = reg.Unregister() }()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		gauge, ok := m.Data.(metricdata.Gauge[int64])
		if m.Name != "llmq.jobs" || !ok {
			continue
		}
		for _, p := range gauge.DataPoints {
			queue, _ := p.Attributes.Value("queue")
			state, _ := p.Attributes.Value("state")
			fmt.Printf("%s %s %d\n", queue.AsString(), state.AsString(), p.Value)
		}
	}
	// Unordered output:
	// default runnable 2
	// default scheduled 1
	// default running 0
}
