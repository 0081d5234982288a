package inbox

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/broker/memory"
	"github.com/llmq/llmq/internal/dbtest"
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
// put them); one it refuses gets a *ValidationError of ErrInvalidMessage.
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
			var invalid *ValidationError
			require.ErrorAs(t, problem, &invalid)
			require.ErrorIs(t, problem, ErrInvalidMessage)
			return
		}
		err := pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
			if _, err := store.Accept(t.Context(), tx, "fuzz", msg, broker.Source{}); err != nil {
				return err
			}
			var stored map[string]string
			if err := tx.QueryRow(t.Context(), "SELECT $1::jsonb", msg.Headers).Scan(&stored); err != nil {
				return err
			}
			require.Equal(t, msg.Headers, stored)
			return errors.New("roll back") // keep the inbox empty for the next input
		})
		require.EqualError(t, err, "roll back")
	})
}
