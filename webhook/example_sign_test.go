package webhook_test

import (
	"fmt"
	"time"

	"github.com/llmq/llmq/webhook"
)

// Sign one attempt the Standard Webhooks way and verify it as a receiver
// would; the secret and message are the specification's test vector.
func ExampleSign() {
	secret, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	key := webhook.Key{ID: "key_1", Secret: secret}
	sentAt := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)

	h := webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, "msg_p5jXN8AQM9LWM0D4loKWxJek", sentAt, body, false)
	fmt.Println(webhook.SignatureHeader+":", h.Get(webhook.SignatureHeader))

	v, err := webhook.NewVerifier(webhook.VerifierConfig{
		Keys: []webhook.Key{key},
		Now:  func() time.Time { return sentAt.Add(time.Minute) }, // received a minute later
	})
	if err != nil {
		panic(err)
	}
	got, err := v.Verify(h, body)
	fmt.Println("verified:", got.ID, got.KeyID, err)

	_, err = v.Verify(h, []byte(`{"test": 2432232315}`))
	fmt.Println("tampered:", err)
	// Output:
	// webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
	// verified: msg_p5jXN8AQM9LWM0D4loKWxJek key_1 <nil>
	// tampered: webhook: no matching signature
}
