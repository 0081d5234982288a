package telemetry

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// ScopePrefix names every llmq instrumentation scope: ScopePrefix + "/lease"
// and so on, the import path of the package that reports.
const ScopePrefix = "github.com/llmq/llmq"

// Meter returns the meter of package pkg (e.g. "lease") from mp, or a no-op
// meter when mp is nil. The global provider is never consulted: a library
// must not report where its host did not ask it to.
func Meter(mp metric.MeterProvider, pkg string) metric.Meter {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	return mp.Meter(ScopePrefix + "/" + pkg)
}

// Tracer returns the tracer of package pkg from tp, or a no-op tracer when
// tp is nil.
func Tracer(tp trace.TracerProvider, pkg string) trace.Tracer {
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	return tp.Tracer(ScopePrefix + "/" + pkg)
}

// Propagator returns p, or the W3C TraceContext propagator when p is nil.
func Propagator(p propagation.TextMapPropagator) propagation.TextMapPropagator {
	if p == nil {
		return propagation.TraceContext{}
	}
	return p
}

// TraceParent is the W3C traceparent header of the span in ctx, or "" when
// ctx carries no valid span context. Jobs store it so that each attempt's
// span joins the trace of the request that accepted the job.
func TraceParent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c["traceparent"]
}

// RemoteContext returns ctx with the remote span context that traceParent
// (a W3C traceparent header) describes; ctx unchanged when it is empty or
// malformed.
func RemoteContext(ctx context.Context, traceParent string) context.Context {
	if traceParent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceParent})
}

// Snapshot caches what read returns for MaxAge, so that observable gauges
// backed by a database query cost one query per MaxAge however often they
// are collected. A failed read is not retried before MaxAge either: a
// database that is down is not asked again on every scrape.
type Snapshot[T any] struct {
	read   func(ctx context.Context) (T, error)
	maxAge time.Duration

	mu    sync.Mutex
	at    time.Time
	value T
	err   error
}

// NewSnapshot returns a snapshot refreshed by read at most every maxAge.
func NewSnapshot[T any](maxAge time.Duration, read func(ctx context.Context) (T, error)) *Snapshot[T] {
	return &Snapshot[T]{read: read, maxAge: maxAge}
}

// snapshotTimeout bounds one read: a scrape must not hang on a database
// that does not answer.
const snapshotTimeout = 10 * time.Second

// Get returns the cached value, reading it again first when it is older
// than MaxAge. Concurrent callers wait for one read.
func (s *Snapshot[T]) Get(ctx context.Context) (T, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at.IsZero() || time.Since(s.at) >= s.maxAge {
		readCtx, cancel := context.WithTimeout(ctx, snapshotTimeout)
		s.value, s.err = s.read(readCtx)
		cancel()
		s.at = time.Now()
	}
	return s.value, s.err
}

// Histogram bucket boundaries, in seconds. The SDK's default boundaries are
// meant for milliseconds and would put every database round trip in the
// first bucket.
var (
	// FastBuckets suit database statements and broker round trips.
	FastBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	// SlowBuckets suit provider calls and a job's life from acceptance to
	// its end, retries and queueing included.
	SlowBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400}
)
