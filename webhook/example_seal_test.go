package webhook_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/llmq/llmq/webhook"
)

// Seal a secret as a store with Config.Sealer does before writing it: the
// sealed value opens only with the same key and for the same endpoint key.
func ExampleNewAESGCMSealer() {
	key := make([]byte, 32) // in production: from your secret manager, never the database
	if _, err := rand.Read(key); err != nil {
		panic(err)
	}
	sealer, err := webhook.NewAESGCMSealer(key)
	if err != nil {
		panic(err)
	}
	secret := webhook.NewSecret()
	sealed, err := sealer.Seal(secret, []byte("endpoint 1, key_1"))
	if err != nil {
		panic(err)
	}
	fmt.Println("raw secret stored:", bytes.Contains(sealed, secret))

	opened, err := sealer.Open(sealed, []byte("endpoint 1, key_1"))
	fmt.Println("opens for its key:", err == nil && bytes.Equal(opened, secret))
	_, err = sealer.Open(sealed, []byte("endpoint 2, key_1"))
	fmt.Println("opens for another:", !errors.Is(err, webhook.ErrSealed))
	// Output:
	// raw secret stored: false
	// opens for its key: true
	// opens for another: false
}
