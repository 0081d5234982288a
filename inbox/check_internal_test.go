package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dberr/dberrtest"
	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/llmqtype"
)

// With no Logger configured, the ingress logs through slog.Default().
func TestIngressLogsThroughSlogDefaultWhenUnconfigured(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t, dbtest.Options{MaxConns: 1})
	store, err := NewStore(Config{Schema: db.Schema})
	require.NoError(t, err)
	handler := func(context.Context, pgx.Tx, broker.Message) error { return nil }
	in, err := store.NewIngress(db.Pool, memory.New(memory.Config{}).Consumer("t"), IngressConfig{Consumer: "c", Handler: handler})
	require.NoError(t, err)
	require.Same(t, slog.Default(), in.cfg.Logger)
}

// FuzzCheckMessage: a message checkMessage passes is accepted by Accept
// and its headers fit a jsonb column (where handlers and trace exporters
// put them); one it refuses gets a *llmqtype.ValidationError of ErrInvalidMessage.
func FuzzCheckMessage(f *testing.F) {
	f.Add("evt-1", []byte(`{}`), "traceparent", "00-abc", false)
	f.Add("", []byte{}, "", "", false)
	f.Add("evt-2", []byte(nil), "k", "v", true)
	f.Add("evt-\x7f", []byte("x"), "k", "\x00", false)
	f.Add("evt-3", []byte("x"), "\xff", "v", false)
	db := dbtest.Setup(f, dbtest.Options{MaxConns: 2})
	store, err := NewStore(Config{Schema: db.Schema})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, id string, body []byte, hk, hv string, nullBody bool) {
		if nullBody {
			body = nil
		} else if body == nil {
			body = []byte{}
		}
		msg := broker.Message{ID: id, Topic: "t", Body: body, Headers: map[string]string{hk: hv}}
		problem := checkMessage(msg)
		if problem != nil {
			var invalid *llmqtype.ValidationError
			require.ErrorAs(t, problem, &invalid)
			require.ErrorIs(t, problem, ErrInvalidMessage)
			return
		}
		err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
			if _, err := store.Accept(t.Context(), tx, "fuzz", msg, broker.Source{}); err != nil {
				return err
			}
			headers, err := jsonText(msg.Headers)
			require.NoError(t, err)
			var stored map[string]string
			if err := tx.QueryRow(t.Context(), "SELECT $1::jsonb", headers).Scan(&stored); err != nil {
				return err
			}
			require.Equal(t, msg.Headers, stored)
			return errors.New("roll back") // keep the inbox empty for the next input
		})
		require.EqualError(t, err, "roll back")
	})
}

// Which handler errors are retried without limit, which are permanent,
// and which count toward MaxAttempts.
func TestFailureClassification(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("handler: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name                 string
		err                  error
		transient, permanent bool
	}{
		{name: "marked transient", err: Transient(errors.New("ERP down")), transient: true},
		{name: "serialization failure", err: pg("40001"), transient: true},
		{name: "deadlock", err: pg("40P01"), transient: true},
		{name: "too many connections", err: pg("53300"), transient: true},
		{name: "admin shutdown", err: pg("57P01"), transient: true},
		{name: "connection failure", err: pg("08006"), transient: true},
		{name: "lock timeout", err: pg("55P03"), transient: true},
		{name: "connection refused", err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}, transient: true},
		{name: "statement timeout: may be the message's doing", err: pg("57014")},
		{name: "unique violation", err: pg("23505")},
		{name: "invalid JSON in the database", err: pg("22P02")},
		{name: "plain error", err: errors.New("ERP says no")},
		{name: "context deadline", err: context.DeadlineExceeded},
		{name: "malformed", err: Malformed(errors.New("not JSON")), permanent: true},
		{name: "validation error", err: fmt.Errorf("enqueue: %w", &llmqtype.ValidationError{Kind: errors.New("jobs: invalid"), Field: "Params", Problem: "bad"}), permanent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.transient, transient(tc.err), "transient")
			require.Equal(t, tc.permanent, permanent(tc.err), "permanent")
		})
	}
}

// The session's trouble the server reports (a statement pgx's cache lost
// behind a pooler, a cached plan a migration changed, a session ended) is
// transient, as the server's own errors give it; a timeout is not, since a
// message can make its own handling slow.
func TestConnectionErrorsAreTransient(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	for what, err := range dberrtest.ConnectionErrors(t, db.Schema) {
		err = fmt.Errorf("handler: %w", err)
		require.Equal(t, what != "timeout", transient(err), "%s: %v", what, err)
		require.False(t, permanent(err), what)
	}
}

// The failure counts keep at most maxTrackedFailures ids, forgetting the
// one that failed least recently; a forgotten id starts again at 1.
func TestFailureCountsForgetTheOldestWhenFull(t *testing.T) {
	t.Parallel()
	f := newFailureCounts()
	require.Equal(t, 1, f.add("first"))
	for i := range maxTrackedFailures - 1 {
		f.add(fmt.Sprintf("id-%d", i))
	}
	require.Equal(t, 2, f.add("first"), "counted again: now the most recent")
	f.add("one more") // evicts id-0, the least recent
	require.Len(t, f.byID, maxTrackedFailures)
	require.Equal(t, 1, f.add("id-0"), "forgotten, so it starts again")
	f.forget("first")
	require.Equal(t, 1, f.add("first"))
}
