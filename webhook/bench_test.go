package webhook_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// BenchmarkSignVerify measures signing one attempt and verifying it, for a
// 1 KiB body with one key and with two (a rotation overlap).
func BenchmarkSignVerify(b *testing.B) {
	body := make([]byte, 1024)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	for _, n := range []int{1, 2} {
		keys := make([]webhook.Key, n)
		for i := range keys {
			keys[i] = webhook.Key{ID: "k" + strconv.Itoa(i), Secret: webhook.NewSecret()}
		}
		v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: keys[n-1:]})
		if err != nil {
			b.Fatal(err)
		}
		b.Run("sign/keys="+strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				webhook.Sign(webhook.SchemeStandard, keys, "msg_1", time.Now(), body, true)
			}
		})
		h := webhook.Sign(webhook.SchemeStandard, keys, "msg_1", time.Now(), body, true)
		b.Run("verify/keys="+strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := v.Verify(h, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeliver measures deliveries end to end: b.N events, each for 8
// endpoints of one tenant (httptest servers answering 204 on loopback),
// delivered by one runner with 8 workers, from its start to the last
// success. Per-endpoint order (one delivery in flight per endpoint) leaves
// the 8 workers one endpoint each.
func BenchmarkDeliver(b *testing.B) {
	f := setup(b)
	var h hits
	const endpoints = 8
	all := make(chan struct{})
	for range endpoints {
		f.register(statusServer(&h, func(n int) int {
			if n == endpoints*b.N {
				close(all)
			}
			return http.StatusNoContent
		}))
	}
	var jobIDs []uuid.UUID
	err := pgx.BeginFunc(b.Context(), f.pool, func(tx pgx.Tx) error {
		for range b.N {
			ds, err := f.store.Enqueue(b.Context(), tx, tenant, webhook.Event{Type: "invoice.extract.completed", Payload: json.RawMessage(`{"invoice":"inv-1"}`)})
			if err != nil {
				return err
			}
			for _, d := range ds {
				jobIDs = append(jobIDs, d.JobID)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	cfg := runnerConfig(map[string]lease.Handler{webhook.Kind: f.dispatcher(webhook.DispatcherConfig{})})
	cfg.Queues = map[string]lease.QueueConfig{webhook.DefaultQueue: {MaxWorkers: 8}}
	b.ResetTimer()
	f.start(cfg)
	<-all
	for _, id := range jobIDs[len(jobIDs)-endpoints:] {
		f.await(id)
	}
	b.StopTimer()
	b.ReportMetric(float64(endpoints*b.N)/b.Elapsed().Seconds(), "deliveries/s")
}
