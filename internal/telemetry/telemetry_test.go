package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/telemetry"
)

// A snapshot reads once per MaxAge however often it is asked, failed reads
// included, and reads again once it is older.
func TestSnapshotReadsAtMostOncePerMaxAge(t *testing.T) {
	t.Parallel()
	reads := 0
	fail := true
	s := telemetry.NewSnapshot(50*time.Millisecond, func(context.Context) (int, error) {
		reads++
		if fail {
			return 0, errors.New("database down")
		}
		return reads, nil
	})
	for range 10 {
		_, err := s.Get(t.Context())
		require.Error(t, err)
	}
	require.Equal(t, 1, reads, "a failing database is not asked on every scrape")
	fail = false
	require.Eventually(t, func() bool {
		v, err := s.Get(t.Context())
		return err == nil && v == 2
	}, time.Second, 5*time.Millisecond)
	v, err := s.Get(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, v)
}

// The traceparent of a span becomes, through RemoteContext, a remote
// parent with the same trace and span ids; nothing yields nothing.
func TestTraceParentRoundTrip(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(t.Context(), "accept")
	defer span.End()

	header := telemetry.TraceParent(ctx)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, header)
	remote := trace.SpanContextFromContext(telemetry.RemoteContext(context.Background(), header))
	require.True(t, remote.IsRemote())
	require.Equal(t, span.SpanContext().TraceID(), remote.TraceID())
	require.Equal(t, span.SpanContext().SpanID(), remote.SpanID())

	require.Empty(t, telemetry.TraceParent(context.Background()))
	require.False(t, trace.SpanContextFromContext(telemetry.RemoteContext(context.Background(), "garbage")).IsValid())
}
