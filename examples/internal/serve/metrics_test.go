package serve_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/llmq/llmq/examples/internal/serve"
)

// What an instrument records is served on the handler in the Prometheus
// text format, and two providers in one process do not collide: each has a
// registry of its own.
func TestMetricsServesPrometheus(t *testing.T) {
	t.Parallel()
	scrape := func(h http.Handler) string {
		srv := httptest.NewServer(h)
		defer srv.Close()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, http.NoBody)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}
	mp, h, err := serve.Metrics()
	require.NoError(t, err)
	t.Cleanup(func() { _ = mp.Shutdown(t.Context()) })
	other, otherHandler, err := serve.Metrics()
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Shutdown(t.Context()) })

	c, err := mp.Meter("test").Int64Counter("llmq.attempts", metric.WithUnit("{attempt}"))
	require.NoError(t, err)
	c.Add(t.Context(), 3, metric.WithAttributes(attribute.String("outcome", "succeeded")))

	body := scrape(h)
	require.Contains(t, body, `llmq_attempts_total{`)
	require.Contains(t, body, `outcome="succeeded"`)
	require.Contains(t, body, "go_goroutines")
	require.NotContains(t, scrape(otherHandler), "llmq_attempts_total")
}
