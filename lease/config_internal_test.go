package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// With no Logger, the runner's warnings and errors reach the process's
// default logger, as it is when each line is written, with their
// attributes; lower levels are dropped. An explicit Logger is kept.
func TestDefaultLoggerPassesWarningsToSlogDefault(t *testing.T) {
	t.Parallel()
	handlers := map[string]Handler{"k": HandlerFunc(func(context.Context, *jobs.Job) (json.RawMessage, error) { return nil, nil })}
	cfg, err := Config{Handlers: handlers}.withDefaults()
	require.NoError(t, err)
	dw, ok := cfg.Logger.Handler().(defaultWarnings)
	require.True(t, ok, "the default logger writes to slog.Default")

	var out bytes.Buffer
	host := slog.New(slog.NewJSONHandler(&bytes.Buffer{}, nil))
	dw.source = func() *slog.Logger { return host }
	logger := slog.New(dw).With("job", "j1").WithGroup("g")
	host = slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})) // set after the runner was built
	logger.Info("llmq: attempt recorded")
	logger.Debug("llmq: noise")
	logger.Warn("llmq: attempt hung", "attempt", 1)
	logger.Error("llmq: PostgreSQL refused an attempt's outcome")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, out.String())
	require.Contains(t, lines[0], `"level":"WARN"`)
	require.Contains(t, lines[0], `"job":"j1"`)
	require.Contains(t, lines[0], `"g":{"attempt":1}`)
	require.Contains(t, lines[1], `"level":"ERROR"`)

	quiet := slog.New(slog.DiscardHandler)
	cfg, err = Config{Handlers: handlers, Logger: quiet}.withDefaults()
	require.NoError(t, err)
	require.Same(t, quiet, cfg.Logger)
}
