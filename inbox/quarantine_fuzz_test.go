package inbox_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/internal/dbtest"
)

// FuzzQuarantineKeepsAnything quarantines arbitrary messages, as a broker
// may deliver them, in the real database: the insert never fails, and the
// row reads back byte for byte, a null body as nil and an empty one as
// empty.
func FuzzQuarantineKeepsAnything(f *testing.F) {
	f.Add("evt-1", []byte(`{"a":1}`), "traceparent", "00-abc", false)
	f.Add("", []byte(nil), "", "", true)
	f.Add("evt-\x00\xff", []byte{}, "k\x00", "\xc3\x28", false)
	f.Add("\xfe", []byte{0}, "\xff", "v", true)
	db := dbtest.Setup(f, dbtest.Options{MaxConns: 2})
	store, err := inbox.NewStore(inbox.Config{Schema: db.Schema})
	require.NoError(f, err)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, id string, body []byte, hk, hv string, nullBody bool) {
		if nullBody {
			body = nil
		} else if body == nil {
			body = []byte{}
		}
		msg := broker.Message{ID: id, Topic: "t", Body: body}
		if hk != "" || hv != "" {
			msg.Headers = map[string]string{hk: hv}
		}
		consumer := fmt.Sprintf("c%d", n.Add(1))
		_, err := store.Quarantine(t.Context(), db.Pool, consumer, msg, broker.Source{Queue: "q"}, "reason with "+id+" "+hv)
		require.NoError(t, err)
		q, err := store.ListQuarantined(t.Context(), db.Pool, consumer, 1)
		require.NoError(t, err)
		require.Len(t, q, 1)
		require.Equal(t, id, q[0].MessageID)
		require.Equal(t, body == nil, q[0].Payload == nil)
		require.Equal(t, string(body[:min(len(body), inbox.MaxQuarantinePayload)]), string(q[0].Payload))
		require.Equal(t, msg.Headers, q[0].Headers)
		require.Equal(t, inbox.Digest(body), q[0].PayloadDigest)
	})
}
