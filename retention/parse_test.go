package retention_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/retention"
)

func TestParseRetention(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"never": retention.Never, "24h": 24 * time.Hour, "7d": 7 * 24 * time.Hour, "90m": 90 * time.Minute, "1s": time.Second} {
		got, err := retention.ParseRetention(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "0", "0s", "-1h", "0d", "-1d", "1.5d", "d", "forever", "99999d", "1y"} {
		_, err := retention.ParseRetention(bad)
		require.Error(t, err, bad)
	}
	require.Equal(t, "7d", retention.FormatRetention(7*24*time.Hour))
	require.Equal(t, "1h30m0s", retention.FormatRetention(90*time.Minute))
	require.Equal(t, "never", retention.FormatRetention(retention.Never))
}

// Whatever is read is positive or Never, and formats back to itself.
func FuzzParseRetention(f *testing.F) {
	for _, s := range []string{"never", "24h", "7d", "90m", "-1h", "1e9h", "36500d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := retention.ParseRetention(s)
		if err != nil {
			return
		}
		require.True(t, d > 0 || d == retention.Never, "%q read as %s", s, d)
		back, err := retention.ParseRetention(retention.FormatRetention(d))
		require.NoError(t, err)
		require.Equal(t, d, back)
	})
}

// A policy read back from the lease row is the policy written; anything
// else in the row is an error or a policy, never a panic.
func FuzzPolicyJSON(f *testing.F) {
	f.Add([]byte(`{"succeeded":"24h0m0s","failed_terminal":"never"}`))
	f.Add([]byte(`{"inbox_records":"-5s"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p retention.Policy
		if err := json.Unmarshal(b, &p); err != nil {
			return
		}
		out, err := json.Marshal(p)
		require.NoError(t, err)
		var back retention.Policy
		require.NoError(t, json.Unmarshal(out, &back))
		require.Equal(t, p, back)
	})
}

func TestPolicyJSONRoundTrip(t *testing.T) {
	t.Parallel()
	p := retention.DefaultPolicy()
	p.Cancelled = retention.Never
	out, err := json.Marshal(p)
	require.NoError(t, err)
	var back retention.Policy
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, p, back)
}
