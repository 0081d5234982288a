package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
)

// A handler that has done one of its writes when the ingress stops, and so
// fails at its next statement, leaves nothing committed: neither its first
// write nor the message's inbox row. Were the inbox row to commit, the
// redelivery would be a duplicate, acknowledged without its work.
func TestIngressHandlerInterruptedByShutdownCommitsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxBatch int
		viaRun   bool // Run a batch of two; otherwise Handle one delivery
	}{
		{name: "Handle, MaxBatch 1", maxBatch: 1},
		{name: "Handle, default MaxBatch", maxBatch: 0},
		{name: "Run, MaxBatch 1", maxBatch: 1, viaRun: true},
		{name: "Run, a batch of two", maxBatch: 2, viaRun: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setupERP(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var calls atomic.Int32
			handler := func(hctx context.Context, tx pgx.Tx, msg broker.Message) error {
				if msg.ID != "m1" {
					return nil
				}
				if calls.Add(1) == 1 && tc.maxBatch > 1 {
					// Fail the whole batch's first try, so that m1 runs
					// again in a savepoint of its own.
					return errors.New("first try fails")
				}
				if _, err := tx.Exec(hctx, "INSERT INTO "+f.schema+".erp_ops (message_id) VALUES ($1)", msg.ID+"-step1"); err != nil {
					return err
				}
				cancel() // the ingress stops between the handler's statements
				_, err := tx.Exec(hctx, "INSERT INTO "+f.schema+".erp_ops (message_id) VALUES ($1)", msg.ID+"-step2")
				return err
			}
			c := f.broker.Consumer("erp")
			in, err := f.store.NewIngress(f.pool, c, inbox.IngressConfig{Consumer: "erp", Handler: handler, MaxBatch: tc.maxBatch, Linger: time.Second})
			require.NoError(t, err)
			msgs := []broker.Message{{ID: "m1", Topic: "erp", Body: []byte(`{}`)}}
			if tc.maxBatch > 1 {
				msgs = append(msgs, broker.Message{ID: "m2", Topic: "erp", Body: []byte(`{}`)})
			}
			f.publish(t, msgs...)
			if tc.viaRun {
				require.NoError(t, in.Run(ctx)) // returns once the handler cancelled ctx
			} else {
				require.Error(t, in.Handle(ctx, receive(t, c)), "the delivery is not accepted")
			}
			require.Zero(t, f.ops(t), "the interrupted handler's first write committed")
			require.Zero(t, f.accepted(t), "the interrupted message is recorded as accepted")
		})
	}
}
