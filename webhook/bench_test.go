package webhook_test

import (
	"strconv"
	"testing"
	"time"

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
