// Package telemetrytest reads what the OpenTelemetry SDK collected, for
// tests: a real MeterProvider on a ManualReader and a real TracerProvider
// on a SpanRecorder, with lookups by instrument name and attributes.
package telemetrytest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Metrics is an SDK MeterProvider whose readings a test collects on demand.
type Metrics struct {
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewMetrics returns a provider on a ManualReader, shut down with t.
func NewMetrics(t testing.TB) *Metrics {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Metrics{Provider: mp, reader: reader}
}

// Collect reads every instrument once (running observable callbacks).
func (m *Metrics) Collect(t testing.TB) Reading {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(t.Context(), &rm))
	return Reading{rm: rm}
}

// Reading is one collection.
type Reading struct{ rm metricdata.ResourceMetrics }

// Names lists the instruments that reported.
func (r Reading) Names() []string {
	var names []string
	for _, sm := range r.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names = append(names, m.Name)
		}
	}
	return names
}

func (r Reading) find(name string) (metricdata.Metrics, bool) {
	for _, sm := range r.rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

func matches(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// Int sums the points of an int64 sum or gauge named name whose attributes
// include attrs; ok is false when no point matched.
func (r Reading) Int(name string, attrs ...attribute.KeyValue) (total int64, ok bool) {
	return sumPoints[int64](r, name, attrs)
}

// Float is Int for float64 sums and gauges.
func (r Reading) Float(name string, attrs ...attribute.KeyValue) (total float64, ok bool) {
	return sumPoints[float64](r, name, attrs)
}

func sumPoints[N int64 | float64](r Reading, name string, attrs []attribute.KeyValue) (total N, ok bool) {
	m, found := r.find(name)
	if !found {
		return 0, false
	}
	var points []metricdata.DataPoint[N]
	switch d := m.Data.(type) {
	case metricdata.Sum[N]:
		points = d.DataPoints
	case metricdata.Gauge[N]:
		points = d.DataPoints
	}
	for _, p := range points {
		if matches(p.Attributes, attrs) {
			total += p.Value
			ok = true
		}
	}
	return total, ok
}

// Histogram returns the count and sum of the float64 histogram named name
// over the points whose attributes include attrs.
func (r Reading) Histogram(name string, attrs ...attribute.KeyValue) (count uint64, sum float64) {
	m, found := r.find(name)
	if !found {
		return 0, 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		return 0, 0
	}
	for _, p := range h.DataPoints {
		if matches(p.Attributes, attrs) {
			count += p.Count
			sum += p.Sum
		}
	}
	return count, sum
}

// Attributes lists the attribute sets the instrument named name reported.
func (r Reading) Attributes(name string) []attribute.Set {
	m, found := r.find(name)
	if !found {
		return nil
	}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		return pointSets(d.DataPoints)
	case metricdata.Sum[float64]:
		return pointSets(d.DataPoints)
	case metricdata.Gauge[int64]:
		return pointSets(d.DataPoints)
	case metricdata.Gauge[float64]:
		return pointSets(d.DataPoints)
	case metricdata.Histogram[float64]:
		sets := make([]attribute.Set, len(d.DataPoints))
		for i, p := range d.DataPoints {
			sets[i] = p.Attributes
		}
		return sets
	}
	return nil
}

func pointSets[N int64 | float64](points []metricdata.DataPoint[N]) []attribute.Set {
	sets := make([]attribute.Set, len(points))
	for i, p := range points {
		sets[i] = p.Attributes
	}
	return sets
}

// Traces is an SDK TracerProvider that records every ended span.
type Traces struct {
	Provider *sdktrace.TracerProvider
	Recorder *tracetest.SpanRecorder
}

// NewTraces returns a provider that samples and records every span, shut
// down with t.
func NewTraces(t testing.TB) *Traces {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Traces{Provider: tp, Recorder: rec}
}

// Ended returns the ended spans named name.
func (tr *Traces) Ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tr.Recorder.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Attr returns the value of the span's attribute key.
func Attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}
