package webhook_test

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/webhook"
)

func newSealer(t testing.TB) *webhook.AESGCMSealer {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	s, err := webhook.NewAESGCMSealer(key)
	require.NoError(t, err)
	return s
}

func TestAESGCMSealer(t *testing.T) {
	t.Parallel()
	s := newSealer(t)
	secret := webhook.NewSecret()
	row := []byte("endpoint-1/key_1")

	sealed, err := s.Seal(secret, row)
	require.NoError(t, err)
	require.False(t, bytes.Contains(sealed, secret), "the secret does not appear in what is stored")
	again, err := s.Seal(secret, row)
	require.NoError(t, err)
	require.NotEqual(t, sealed, again, "a fresh nonce each time")

	opened, err := s.Open(sealed, row)
	require.NoError(t, err)
	require.Equal(t, secret, opened)

	_, err = s.Open(sealed, []byte("endpoint-2/key_1"))
	require.ErrorIs(t, err, webhook.ErrSealed, "a sealed value copied onto another key does not open")
	altered := bytes.Clone(sealed)
	altered[len(altered)-1] ^= 1
	_, err = s.Open(altered, row)
	require.ErrorIs(t, err, webhook.ErrSealed)
	_, err = newSealer(t).Open(sealed, row)
	require.ErrorIs(t, err, webhook.ErrSealed, "another key")
	_, err = s.Open(secret, row)
	require.ErrorIs(t, err, webhook.ErrSealed, "a raw secret is not a sealed value")

	_, err = webhook.NewAESGCMSealer(make([]byte, 16))
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
}

// Whatever is stored in the secret column, Open returns an error or the
// secret, and never panics.
func FuzzAESGCMSealerOpen(f *testing.F) {
	s := newSealer(f)
	sealed, err := s.Seal(webhook.NewSecret(), []byte("row"))
	require.NoError(f, err)
	f.Add(sealed, []byte("row"))
	f.Add([]byte{1}, []byte(""))
	f.Add([]byte{}, []byte("row"))
	f.Fuzz(func(t *testing.T, stored, row []byte) {
		secret, err := s.Open(stored, row)
		if err != nil {
			require.ErrorIs(t, err, webhook.ErrSealed)
			require.Nil(t, secret)
		}
	})
}
