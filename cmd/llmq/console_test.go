package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// llmq console serves the web console on the schema until its context
// ends, and refuses a bad address or refresh before connecting.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.migrated()
	for _, args := range [][]string{{"-addr", "nowhere"}, {"-refresh", "-1s"}} {
		code, _, stderr := c.run(append([]string{"console"}, args...)...)
		require.Equal(t, 2, code, args)
		require.Contains(t, stderr, args[0], args)
	}

	ctx, cancel := context.WithCancel(t.Context())
	out, w := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"console", "-addr", "127.0.0.1:0"}, c.flags()...), w, io.Discard)
		_ = w.Close()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`http://(\S+)/`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	client := &http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+m[1]+"/jobs", http.NoBody)
	require.NoError(t, err)
	res, err := client.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, res.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, string(body), "read-only")
	go func() { _, _ = io.Copy(io.Discard, out) }() // until the command's stdout closes
	cancel()
	require.Equal(t, 0, <-done)
}
