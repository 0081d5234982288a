package kvfeedback_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/admission/kvfeedback"
	"github.com/llmq/llmq/internal/dbtest"
)

// Observers of one pool in several processes take turns through the
// pool's lease: while one holds it, a server under pressure lowers the
// budget once per reading, not once per observer; when the holder stops
// (its lease freed) or its lease lapses, another takes over.
func TestObserversOfAPoolTakeTurns(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	ctx := t.Context()
	l, err := admission.NewPostgres(db.Pool, admission.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, l.SetPool(ctx, admission.Pool{Name: "gpu", RPM: 1000, TPM: 1 << 30, MaxInFlight: 10, MaxInFlightTokens: 100_000}))
	s := &server{}
	s.set(3, 0, 0, 0) // requests waiting: every reading is pressure
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	observer := func(holder string) *kvfeedback.Observer {
		// Steps are driven by hand; an hour's interval keeps the lease
		// (3 hours) from lapsing on its own during the test.
		o, err := kvfeedback.New(l, kvfeedback.Config{Pool: "gpu", MetricsURL: srv.URL + "/metrics", Model: "m", Ceiling: 100_000,
			Interval: time.Hour, DB: db.Pool, Schema: db.Schema, Holder: holder})
		require.NoError(t, err)
		return o
	}
	budget := func() int64 {
		st, err := l.State(ctx, "gpu")
		require.NoError(t, err)
		return st.MaxInFlightTokens
	}
	first, second, third := observer("first"), observer("second"), observer("third")

	r, err := first.Step(ctx)
	require.NoError(t, err)
	require.False(t, r.Standby)
	require.Equal(t, int64(70_000), r.Budget)
	for range 2 {
		for _, o := range []*kvfeedback.Observer{second, third} {
			r, err := o.Step(ctx)
			require.NoError(t, err)
			require.Equal(t, kvfeedback.Reading{Standby: true}, r, "another observer holds the lease")
		}
	}
	_, err = first.Step(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(49_000), budget(), "two readings of the holder, two decreases; the standbys' readings none")

	// The holder stops: Run frees the lease, and the next standby to read
	// takes over at once.
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, first.Run(stopped))
	r, err = second.Step(ctx)
	require.NoError(t, err)
	require.False(t, r.Standby)
	require.Equal(t, int64(34_300), r.Budget)
	r, err = first.Step(ctx)
	require.NoError(t, err)
	require.True(t, r.Standby, "the first observer is a standby now")

	// A holder that stops reading (a paused or dead process) loses the
	// lease when it lapses.
	_, err = db.Pool.Exec(ctx, "UPDATE "+db.Schema+".admission_observer_leases SET lease_until = now() - interval '1 second'")
	require.NoError(t, err)
	r, err = third.Step(ctx)
	require.NoError(t, err)
	require.False(t, r.Standby)
	require.Equal(t, int64(24_010), r.Budget)
	r, err = second.Step(ctx)
	require.NoError(t, err)
	require.True(t, r.Standby)
	require.Equal(t, int64(24_010), budget())
}

// The lease settings are checked at construction, naming the field.
func TestLeaseConfigIsValidated(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	good := kvfeedback.Config{Pool: "p", MetricsURL: "http://127.0.0.1:1/metrics", Ceiling: 10, DB: db.Pool, Schema: db.Schema}
	requireRefused(t, good, map[string]func(c *kvfeedback.Config){
		"Lease":  func(c *kvfeedback.Config) { c.Interval, c.Lease = time.Second, 1500*time.Millisecond },
		"Schema": func(c *kvfeedback.Config) { c.Schema = "Not A Schema" },
	})
}
