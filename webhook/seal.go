package webhook

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/llmq/llmq/llmqtype"
)

// SecretSealer encrypts endpoint secrets before they are stored, and
// decrypts them when a delivery is signed (Config.Sealer). associated binds
// a sealed secret to its row (the endpoint and key ids): a sealed value
// copied onto another key does not open.
type SecretSealer interface {
	Seal(secret, associated []byte) ([]byte, error)
	Open(sealed, associated []byte) ([]byte, error)
}

// ErrSealed is returned when a stored secret cannot be opened: it was
// sealed and no Config.Sealer is set, or the sealer refuses it (another
// key, or a value that was altered).
var ErrSealed = errors.New("webhook: sealed secret")

// sealVersion is the first byte of every value AESGCMSealer seals, so that
// another layout can follow without guessing.
const sealVersion = 1

// AESGCMSealer seals secrets with AES-256-GCM under one key. A sealed value
// is a version byte, a random 12-byte nonce and the ciphertext with its tag.
type AESGCMSealer struct {
	aead cipher.AEAD
}

// NewAESGCMSealer returns a sealer for a 32-byte key. Keep the key outside
// the database (a secret manager, the environment): sealing protects the
// secrets in a dump or a replica only while the key is elsewhere.
func NewAESGCMSealer(key []byte) (*AESGCMSealer, error) {
	if len(key) != 32 {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "key", Problem: fmt.Sprintf("is %d bytes; AES-256 needs 32", len(key))}
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("webhook: sealer: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("webhook: sealer: %w", err)
	}
	return &AESGCMSealer{aead: aead}, nil
}

// Seal implements SecretSealer.
func (s *AESGCMSealer) Seal(secret, associated []byte) ([]byte, error) {
	out := make([]byte, 1+s.aead.NonceSize(), 1+s.aead.NonceSize()+len(secret)+s.aead.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("webhook: sealing a secret: %w", err)
	}
	return s.aead.Seal(out, out[1:], secret, associated), nil
}

// Open implements SecretSealer.
func (s *AESGCMSealer) Open(sealed, associated []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < 1+n+s.aead.Overhead() || sealed[0] != sealVersion {
		return nil, fmt.Errorf("%w: not a value this sealer wrote", ErrSealed)
	}
	secret, err := s.aead.Open(nil, sealed[1:1+n], sealed[1+n:], associated)
	if err != nil {
		return nil, fmt.Errorf("%w: it does not open with this key (another key, or altered)", ErrSealed)
	}
	return secret, nil
}

// keyAssociation is the associated data a key's secret is sealed with.
func keyAssociation(endpoint [16]byte, keyID string) []byte {
	return append(endpoint[:], keyID...)
}
