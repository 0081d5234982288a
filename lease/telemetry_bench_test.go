package lease

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/llmq/llmq/jobs"
)

// BenchmarkAttemptTelemetry is what one attempt's telemetry costs the
// runner (span, logger, the three per-attempt measurements), without a
// MeterProvider and with an SDK one:
//
//	go test -run '^$' -bench AttemptTelemetry -benchmem ./lease
func BenchmarkAttemptTelemetry(b *testing.B) {
	job := &jobs.Job{ID: uuid.Must(uuid.NewV7()), Tenant: "acme", Kind: "invoice.extract", Queue: "extraction", Attempt: 1, Fence: 1}
	now := time.Now()
	job.CreatedAt = now.Add(-time.Second)
	res := jobs.CompletionResult{JobID: job.ID, State: jobs.StateSucceeded, FinishedAt: now}
	c := jobs.Completion{Outcome: jobs.OutcomeSucceeded}
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"none", Config{}},
		{"sdk", Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := tc.cfg
			cfg.Handlers = map[string]Handler{"invoice.extract": HandlerFunc(nil)}
			cfg, err := cfg.withDefaults()
			if err != nil {
				b.Fatal(err)
			}
			r := &Runner{cfg: cfg, obs: cfg.obs}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				actx, span, _ := r.startAttempt(ctx, job)
				r.endAttempt(actx, span, job, c, time.Millisecond, &res, nil)
			}
		})
	}
}
