package webhook

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

// The headers of a signed delivery. The first three are the Standard Webhooks
// headers; KeyIDHeader is llmq's own and optional.
const (
	IDHeader        = "webhook-id"
	TimestampHeader = "webhook-timestamp"
	SignatureHeader = "webhook-signature"
	// KeyIDHeader lists the key id of each signature in SignatureHeader,
	// space-separated, in the same order.
	KeyIDHeader = "webhook-key-id"
)

// SecretPrefix starts every secret in its text form, as Standard Webhooks
// writes them.
const SecretPrefix = "whsec_"

// Limits on what a signer produces and a verifier reads.
const (
	MinSecretBytes     = 24 // the Standard Webhooks recommendation
	MaxSecretBytes     = 64
	MaxKeyIDLen        = 64
	MaxSignatures      = 8    // keys signing at once (rotation overlap) and signatures a verifier reads
	MaxSignatureHeader = 1024 // bytes of webhook-signature a verifier reads
	MaxIDLen           = 255  // bytes of webhook-id
	DefaultTolerance   = 5 * time.Minute
	newSecretBytes     = 32
)

// Scheme is a signature layout. Its value is the version tag written before
// each signature in the webhook-signature header.
type Scheme string

const (
	// SchemeStandard is Standard Webhooks' v1: the base64 HMAC-SHA256 of
	// "id.timestamp.body". Receivers can verify it with the specification's
	// libraries in any language. The default.
	SchemeStandard Scheme = "v1"
	// SchemeTimestampFirst is the base64 HMAC-SHA256 of
	// "timestamp.id.body", the layout llmq's first receivers verified,
	// tagged "t1" so that it can never be mistaken for v1. Its ids hold no
	// '.' (Verify refuses one with ErrMalformedHeader): the timestamp is
	// digits only, so the signed string then splits one way only. With a
	// '.' allowed, the MAC of id "a" and body "b.c" would also be the MAC
	// of id "a.b" and body "c". Delivery ids are UUIDs, which have none.
	SchemeTimestampFirst Scheme = "t1"
)

// Valid reports whether s is a scheme llmq signs with.
func (s Scheme) Valid() bool { return s == SchemeStandard || s == SchemeTimestampFirst }

// Errors a verifier returns. Every one is a reason to answer 4xx; callers
// branch on them with errors.Is.
var (
	// ErrMissingHeader means webhook-id, webhook-timestamp or webhook-signature
	// is absent or empty.
	ErrMissingHeader = errors.New("webhook: missing signature header")
	// ErrMalformedHeader means a header is too long or not in its format.
	ErrMalformedHeader = errors.New("webhook: malformed signature header")
	// ErrTimestampTooOld and ErrTimestampTooNew mean the timestamp lies outside
	// the verifier's tolerance (a replay, or a badly skewed clock).
	ErrTimestampTooOld = errors.New("webhook: timestamp too old")
	ErrTimestampTooNew = errors.New("webhook: timestamp too far in the future")
	// ErrNoMatchingSignature means no signature in the header was made by one of
	// the verifier's keys over this exact body.
	ErrNoMatchingSignature = errors.New("webhook: no matching signature")
	// ErrInvalidKey is matched by every *llmqtype.ValidationError about a key or
	// secret.
	ErrInvalidKey = errors.New("webhook: invalid key")
)

// Key is one signing secret and the id it is known by. During a rotation an
// endpoint has two keys and every delivery carries a signature of each.
//
// A Key written out names its id only, never its secret: fmt (every verb),
// slog (any handler) and encoding/json all go through String, LogValue or
// MarshalJSON, so logging or marshalling a key cannot leak the secret.
// Show a secret on purpose with FormatSecret(k.Secret).
type Key struct {
	// ID names the key in attempt records and in KeyIDHeader: at most
	// MaxKeyIDLen bytes of letters, digits, '.', '_' and '-'.
	ID string
	// Secret is the raw HMAC key, MinSecretBytes to MaxSecretBytes.
	Secret []byte
}

// String names the key by its id, without the secret.
func (k Key) String() string { return "webhook.Key{ID: " + strconv.Quote(k.ID) + "}" }

// Format writes String for every verb: without it %#v, %d and friends
// print the fields, secret included, since they ignore String.
func (k Key) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, k.String()) }

// LogValue is the key as slog handlers write it: its id only. The JSON
// handler ignores String and would otherwise marshal the struct, secret
// included.
func (k Key) LogValue() slog.Value { return slog.GroupValue(slog.String("id", k.ID)) }

// MarshalJSON writes {"id": ...} and no secret, so that a Key marshalled
// into a log line or an API answer by mistake does not carry it.
func (k Key) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		ID string `json:"id"`
	}{k.ID})
}

// Validate reports a key llmq cannot sign or verify with.
func (k Key) Validate() error {
	if p := keyIDProblem(k.ID); p != "" {
		return &llmqtype.ValidationError{Kind: ErrInvalidKey, Field: "ID", Problem: p}
	}
	if n := len(k.Secret); n < MinSecretBytes || n > MaxSecretBytes {
		return &llmqtype.ValidationError{Kind: ErrInvalidKey, Field: "Secret",
			Problem: fmt.Sprintf("is %d bytes; must be %d to %d", n, MinSecretBytes, MaxSecretBytes)}
	}
	return nil
}

func keyIDProblem(id string) string {
	if p := validate.Text(id, true, MaxKeyIDLen); p != "" {
		return p
	}
	for _, r := range id {
		if !isIDRune(r) {
			return "may hold only letters, digits, '.', '_' and '-'"
		}
	}
	return ""
}

func isIDRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}

// ParseSecret decodes a secret in its text form, "whsec_" and the base64 of
// the raw key (the prefix is optional, as in the Standard Webhooks
// libraries).
func ParseSecret(s string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, SecretPrefix))
	if err != nil {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidKey, Field: "Secret", Problem: "is not base64 after the whsec_ prefix"}
	}
	if n := len(raw); n < MinSecretBytes || n > MaxSecretBytes {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidKey, Field: "Secret",
			Problem: fmt.Sprintf("decodes to %d bytes; must be %d to %d", n, MinSecretBytes, MaxSecretBytes)}
	}
	return raw, nil
}

// FormatSecret is the text form of a raw secret: "whsec_" and its base64.
func FormatSecret(raw []byte) string { return SecretPrefix + base64.StdEncoding.EncodeToString(raw) }

// NewSecret returns a fresh random 32-byte secret.
func NewSecret() []byte {
	b := make([]byte, newSecretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics instead)
	return b
}

// Signature computes one signature entry ("v1,<base64>") of body under
// scheme and secret. Under SchemeTimestampFirst id must not hold a '.': a
// Verifier refuses such an id.
func Signature(scheme Scheme, secret []byte, id string, ts time.Time, body []byte) string {
	return string(scheme) + "," + base64.StdEncoding.EncodeToString(mac(scheme, secret, id, ts.Unix(), body))
}

func mac(scheme Scheme, secret []byte, id string, unix int64, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	ts := strconv.FormatInt(unix, 10)
	if scheme == SchemeTimestampFirst {
		h.Write([]byte(ts + "." + id + "."))
	} else {
		h.Write([]byte(id + "." + ts + "."))
	}
	h.Write(body)
	return h.Sum(nil)
}

// Sign returns the headers of one attempt: the delivery id, ts, and one
// signature of body per key (several during a rotation), with the key ids in
// KeyIDHeader when sendKeyIDs is set. Sign a fresh ts for every attempt, over
// exactly the bytes sent.
func Sign(scheme Scheme, keys []Key, id string, ts time.Time, body []byte, sendKeyIDs bool) http.Header {
	sigs := make([]string, len(keys))
	ids := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = Signature(scheme, k.Secret, id, ts, body)
		ids[i] = k.ID
	}
	h := http.Header{}
	h.Set(IDHeader, id)
	h.Set(TimestampHeader, strconv.FormatInt(ts.Unix(), 10))
	h.Set(SignatureHeader, strings.Join(sigs, " "))
	if sendKeyIDs {
		h.Set(KeyIDHeader, strings.Join(ids, " "))
	}
	return h
}

// Verifier checks signed deliveries on the receiving side. Build it with
// NewVerifier; it is safe for concurrent use.
type Verifier struct {
	keys      []Key
	scheme    Scheme
	tolerance time.Duration
	now       func() time.Time
}

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	// Keys are the secrets a delivery may be signed with: during the
	// sender's rotation, the old and the new one. At least one. If the
	// sender sends KeyIDHeader, the IDs must be the sender's key ids
	// (RegisterEndpoint and RotateSecret return them); otherwise any ID will
	// do.
	Keys []Key
	// Scheme is the one layout accepted. Default SchemeStandard.
	Scheme Scheme
	// Tolerance is how far the timestamp may lie from now, in either
	// direction. Default 5 minutes.
	Tolerance time.Duration
	// Now is the clock; default time.Now. For tests.
	Now func() time.Time
}

// NewVerifier validates cfg once.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if len(cfg.Keys) == 0 || len(cfg.Keys) > MaxSignatures {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "Keys", Problem: fmt.Sprintf("has %d keys; want 1 to %d", len(cfg.Keys), MaxSignatures)}
	}
	for i, k := range cfg.Keys {
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("webhook: Keys[%d]: %w", i, err)
		}
	}
	scheme := cmp.Or(cfg.Scheme, SchemeStandard)
	if !scheme.Valid() {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "Scheme", Problem: fmt.Sprintf("%q is not a known scheme", cfg.Scheme)}
	}
	if cfg.Tolerance < 0 {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "Tolerance", Problem: "must not be negative"}
	}
	v := &Verifier{keys: cfg.Keys, scheme: scheme, tolerance: cmp.Or(cfg.Tolerance, DefaultTolerance), now: cfg.Now}
	if v.now == nil {
		v.now = time.Now
	}
	return v, nil
}

// Verified describes a delivery whose signature checked out.
type Verified struct {
	ID        string
	Timestamp time.Time
	// KeyID is the id of the key whose signature matched.
	KeyID string
}

// Verify checks h's signature of body: the headers are present and well
// formed, the timestamp lies within the tolerance, and some signature of the
// verifier's scheme was made by one of its keys over exactly body. MACs are
// compared in constant time. A key id header, when present, must name the
// matching key at the matching position.
func (v *Verifier) Verify(h http.Header, body []byte) (Verified, error) {
	id, tsText, sigText := h.Get(IDHeader), h.Get(TimestampHeader), h.Get(SignatureHeader)
	switch {
	case id == "":
		return Verified{}, fmt.Errorf("%w: %s", ErrMissingHeader, IDHeader)
	case tsText == "":
		return Verified{}, fmt.Errorf("%w: %s", ErrMissingHeader, TimestampHeader)
	case sigText == "":
		return Verified{}, fmt.Errorf("%w: %s", ErrMissingHeader, SignatureHeader)
	case len(id) > MaxIDLen:
		return Verified{}, fmt.Errorf("%w: %s is longer than %d bytes", ErrMalformedHeader, IDHeader, MaxIDLen)
	case v.scheme == SchemeTimestampFirst && strings.Contains(id, "."):
		// "timestamp.id.body" is ambiguous once the id may hold a '.': the
		// id/body split could be moved to any '.' of the body.
		return Verified{}, fmt.Errorf("%w: %s holds a '.', which scheme %s does not allow", ErrMalformedHeader, IDHeader, v.scheme)
	case len(sigText) > MaxSignatureHeader:
		return Verified{}, fmt.Errorf("%w: %s is longer than %d bytes", ErrMalformedHeader, SignatureHeader, MaxSignatureHeader)
	}
	unix, err := parseTimestamp(tsText)
	if err != nil {
		return Verified{}, err
	}
	now := v.now().Unix()
	switch {
	case unix < now-int64(v.tolerance/time.Second):
		return Verified{}, fmt.Errorf("%w: %d is before now (%d) minus %s", ErrTimestampTooOld, unix, now, v.tolerance)
	case unix > now+int64(v.tolerance/time.Second):
		return Verified{}, fmt.Errorf("%w: %d is after now (%d) plus %s", ErrTimestampTooNew, unix, now, v.tolerance)
	}
	kidHeader := h.Get(KeyIDHeader)
	keyIDs := strings.Fields(kidHeader)
	expected := make([][]byte, len(v.keys))
	for i, k := range v.keys {
		expected[i] = mac(v.scheme, k.Secret, id, unix, body)
	}
	for pos, entry := range strings.Fields(sigText) {
		if pos >= MaxSignatures {
			break
		}
		version, b64, ok := strings.Cut(entry, ",")
		if !ok || Scheme(version) != v.scheme {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			continue // garbage never matches; other entries may
		}
		for i, k := range v.keys {
			if !hmac.Equal(got, expected[i]) {
				continue
			}
			if kidHeader != "" && (pos >= len(keyIDs) || keyIDs[pos] != k.ID) {
				continue
			}
			return Verified{ID: id, Timestamp: time.Unix(unix, 0), KeyID: k.ID}, nil
		}
	}
	return Verified{}, ErrNoMatchingSignature
}

// parseTimestamp reads integer Unix seconds: ASCII digits only, at most 12 of
// them (no sign, no fraction), so that no spelling overflows.
func parseTimestamp(s string) (int64, error) {
	if len(s) > 12 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%w: %s is not Unix seconds", ErrMalformedHeader, TimestampHeader)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrMalformedHeader, TimestampHeader, err)
	}
	return n, nil
}
