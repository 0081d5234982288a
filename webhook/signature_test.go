package webhook_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/webhook"
)

// The Standard Webhooks specification's published test vector, as its
// reference libraries' tests use it.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func vectorKey(t *testing.T) webhook.Key {
	t.Helper()
	secret, err := webhook.ParseSecret(vectorSecret)
	require.NoError(t, err)
	return webhook.Key{ID: "k1", Secret: secret}
}

func verifier(t *testing.T, now time.Time, keys ...webhook.Key) *webhook.Verifier {
	t.Helper()
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: keys, Now: func() time.Time { return now }})
	require.NoError(t, err)
	return v
}

func TestSignatureMatchesTheStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	key := vectorKey(t)
	ts := time.Unix(vectorTimestamp, 0)
	require.Equal(t, vectorSignature, webhook.Signature(webhook.SchemeStandard, key.Secret, vectorID, ts, []byte(vectorBody)))

	h := webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, vectorID, ts, []byte(vectorBody), false)
	require.Equal(t, vectorSignature, h.Get(webhook.SignatureHeader))
	require.Equal(t, vectorID, h.Get(webhook.IDHeader))
	require.Equal(t, strconv.Itoa(vectorTimestamp), h.Get(webhook.TimestampHeader))

	got, err := verifier(t, ts.Add(time.Minute), key).Verify(h, []byte(vectorBody))
	require.NoError(t, err)
	require.Equal(t, webhook.Verified{ID: vectorID, Timestamp: ts, KeyID: "k1"}, got)
}

func TestSignatureSchemesAreDistinct(t *testing.T) {
	t.Parallel()
	key := vectorKey(t)
	ts := time.Unix(vectorTimestamp, 0)
	body := []byte(vectorBody)
	t1 := webhook.Sign(webhook.SchemeTimestampFirst, []webhook.Key{key}, vectorID, ts, body, false)
	require.True(t, strings.HasPrefix(t1.Get(webhook.SignatureHeader), "t1,"))

	// The seed's layout: HMAC over "timestamp.id.body".
	v1, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}, Scheme: webhook.SchemeTimestampFirst, Now: func() time.Time { return ts }})
	require.NoError(t, err)
	_, err = v1.Verify(t1, body)
	require.NoError(t, err)

	// A verifier of one scheme never accepts the other's signature.
	_, err = verifier(t, ts, key).Verify(t1, body)
	require.ErrorIs(t, err, webhook.ErrNoMatchingSignature)
	std := webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, vectorID, ts, body, false)
	_, err = v1.Verify(std, body)
	require.ErrorIs(t, err, webhook.ErrNoMatchingSignature)
}

func TestRotationSignsWithEveryKey(t *testing.T) {
	t.Parallel()
	oldKey := webhook.Key{ID: "old", Secret: webhook.NewSecret()}
	newKey := webhook.Key{ID: "new", Secret: webhook.NewSecret()}
	now := time.Now()
	body := []byte(`{"a":1}`)
	h := webhook.Sign(webhook.SchemeStandard, []webhook.Key{newKey, oldKey}, "d1", now, body, true)
	require.Len(t, strings.Fields(h.Get(webhook.SignatureHeader)), 2)
	require.Equal(t, "new old", h.Get(webhook.KeyIDHeader))

	// A receiver that knows only the old key, or only the new one, accepts.
	got, err := verifier(t, now, oldKey).Verify(h, body)
	require.NoError(t, err)
	require.Equal(t, "old", got.KeyID)
	got, err = verifier(t, now, newKey).Verify(h, body)
	require.NoError(t, err)
	require.Equal(t, "new", got.KeyID)

	// Key ids must name the matching key at its position.
	h.Set(webhook.KeyIDHeader, "old new")
	_, err = verifier(t, now, oldKey).Verify(h, body)
	require.ErrorIs(t, err, webhook.ErrNoMatchingSignature)
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	key := vectorKey(t)
	now := time.Unix(vectorTimestamp, 0)
	body := []byte(vectorBody)
	good := func() http.Header {
		return webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, vectorID, now, body, false)
	}
	other := webhook.Key{ID: "k1", Secret: webhook.NewSecret()}
	cases := []struct {
		name   string
		header func() http.Header
		body   string
		v      *webhook.Verifier
		want   error
	}{
		{"tampered body", good, `{"test": 2432232315}`, nil, webhook.ErrNoMatchingSignature},
		{"body with a trailing newline", good, vectorBody + "\n", nil, webhook.ErrNoMatchingSignature},
		{"wrong key", good, vectorBody, verifier(t, now, other), webhook.ErrNoMatchingSignature},
		{"six minutes old", good, vectorBody, verifier(t, now.Add(6*time.Minute), key), webhook.ErrTimestampTooOld},
		{"six minutes ahead", good, vectorBody, verifier(t, now.Add(-6*time.Minute), key), webhook.ErrTimestampTooNew},
		{"missing id", func() http.Header { h := good(); h.Del(webhook.IDHeader); return h }, vectorBody, nil, webhook.ErrMissingHeader},
		{"missing timestamp", func() http.Header { h := good(); h.Del(webhook.TimestampHeader); return h }, vectorBody, nil, webhook.ErrMissingHeader},
		{"missing signature", func() http.Header { h := good(); h.Del(webhook.SignatureHeader); return h }, vectorBody, nil, webhook.ErrMissingHeader},
		{"garbage base64", func() http.Header { h := good(); h.Set(webhook.SignatureHeader, "v1,!!!not-base64!!!"); return h }, vectorBody, nil, webhook.ErrNoMatchingSignature},
		{"truncated signature", func() http.Header {
			h := good()
			h.Set(webhook.SignatureHeader, vectorSignature[:20])
			return h
		}, vectorBody, nil, webhook.ErrNoMatchingSignature},
		{"signature without version", func() http.Header {
			h := good()
			h.Set(webhook.SignatureHeader, strings.TrimPrefix(vectorSignature, "v1,"))
			return h
		}, vectorBody, nil, webhook.ErrNoMatchingSignature},
		{"empty signature of the right length", func() http.Header {
			h := good()
			h.Set(webhook.SignatureHeader, "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32)))
			return h
		}, vectorBody, nil, webhook.ErrNoMatchingSignature},
		{"negative timestamp", func() http.Header { h := good(); h.Set(webhook.TimestampHeader, "-1614265330"); return h }, vectorBody, nil, webhook.ErrMalformedHeader},
		{"fractional timestamp", func() http.Header { h := good(); h.Set(webhook.TimestampHeader, "1614265330.5"); return h }, vectorBody, nil, webhook.ErrMalformedHeader},
		{"huge timestamp", func() http.Header { h := good(); h.Set(webhook.TimestampHeader, "99999999999999999999999"); return h }, vectorBody, nil, webhook.ErrMalformedHeader},
		{"oversize signature header", func() http.Header {
			h := good()
			h.Set(webhook.SignatureHeader, strings.Repeat(vectorSignature+" ", 40))
			return h
		}, vectorBody, nil, webhook.ErrMalformedHeader},
		{"oversize id", func() http.Header { h := good(); h.Set(webhook.IDHeader, strings.Repeat("x", 300)); return h }, vectorBody, nil, webhook.ErrMalformedHeader},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := tc.v
			if v == nil {
				v = verifier(t, now, key)
			}
			_, err := v.Verify(tc.header(), []byte(tc.body))
			require.ErrorIs(t, err, tc.want)
		})
	}
}

func TestKeysAndSecretsAreValidated(t *testing.T) {
	t.Parallel()
	_, err := webhook.ParseSecret("whsec_!!!")
	require.ErrorIs(t, err, webhook.ErrInvalidKey)
	_, err = webhook.ParseSecret("whsec_" + base64.StdEncoding.EncodeToString([]byte("short")))
	require.ErrorIs(t, err, webhook.ErrInvalidKey)
	raw := webhook.NewSecret()
	parsed, err := webhook.ParseSecret(webhook.FormatSecret(raw))
	require.NoError(t, err)
	require.Equal(t, raw, parsed)

	require.ErrorIs(t, webhook.Key{ID: "has space", Secret: raw}.Validate(), webhook.ErrInvalidKey)
	require.ErrorIs(t, webhook.Key{ID: "k", Secret: raw[:8]}.Validate(), webhook.ErrInvalidKey)
	require.NotContains(t, webhook.Key{ID: "k", Secret: raw}.String(), base64.StdEncoding.EncodeToString(raw))

	_, err = webhook.NewVerifier(webhook.VerifierConfig{})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
	_, err = webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{{ID: "k", Secret: raw}}, Scheme: "v9"})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
}

// FuzzVerify feeds arbitrary headers and bodies to the verifier: it never
// panics, and it accepts only a signature made with its key over that body.
func FuzzVerify(f *testing.F) {
	f.Add(vectorID, strconv.Itoa(vectorTimestamp), vectorSignature, "", []byte(vectorBody))
	f.Add(vectorID, "1614265330", "v1,!!! v1,"+vectorSignature[3:], "k1 k1", []byte(vectorBody))
	f.Add("", "", "", "", []byte{})
	f.Add("x", "-1", "v1a,abc", "a b c", []byte("\x00"))
	f.Add("x", "0001614265330", "t1,"+vectorSignature[3:], "", []byte(vectorBody))
	secret, err := webhook.ParseSecret(vectorSecret)
	if err != nil {
		f.Fatal(err)
	}
	key := webhook.Key{ID: "k1", Secret: secret}
	now := time.Unix(vectorTimestamp, 0)
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}, Now: func() time.Time { return now }})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, ts, sig, kid string, body []byte) {
		h := http.Header{}
		h.Set(webhook.IDHeader, id)
		h.Set(webhook.TimestampHeader, ts)
		h.Set(webhook.SignatureHeader, sig)
		h.Set(webhook.KeyIDHeader, kid)
		got, err := v.Verify(h, body)
		if err != nil {
			return
		}
		// Accepted: some entry must be exactly our signature of this body.
		unix, perr := strconv.ParseInt(ts, 10, 64)
		if perr != nil {
			t.Fatalf("accepted an unparsable timestamp %q", ts)
		}
		want := webhook.Signature(webhook.SchemeStandard, secret, id, time.Unix(unix, 0), body)
		if !strings.Contains(" "+h.Get(webhook.SignatureHeader)+" ", " "+want+" ") && !strings.Contains(h.Get(webhook.SignatureHeader), want) {
			t.Fatalf("accepted %q without our signature %q", sig, want)
		}
		if got.ID != id || got.KeyID != "k1" {
			t.Fatalf("verified %+v for id %q", got, id)
		}
	})
}

// FuzzParseSecret: any text either parses to a usable key whose text form
// parses back to the same bytes, or is refused with ErrInvalidKey.
func FuzzParseSecret(f *testing.F) {
	for _, seed := range []string{vectorSecret, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_====", "whsec_" + strings.Repeat("A", 200), ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, err := webhook.ParseSecret(s)
		if err != nil {
			if !errors.Is(err, webhook.ErrInvalidKey) {
				t.Fatalf("%q: untyped error %v", s, err)
			}
			return
		}
		if err := (webhook.Key{ID: "k", Secret: raw}).Validate(); err != nil {
			t.Fatalf("%q parsed to an unusable key: %v", s, err)
		}
		again, err := webhook.ParseSecret(webhook.FormatSecret(raw))
		if err != nil || !bytes.Equal(again, raw) {
			t.Fatalf("%q does not round-trip: %v", s, err)
		}
	})
}

// t1 signs "timestamp.id.body": were a '.' allowed in the id, the same MAC
// would cover id "a" with body "b.c" and id "a.b" with body "c", so a
// captured delivery could be replayed under another id with a shorter body.
// Verify refuses a t1 id with a '.', which makes the split unambiguous
// (the timestamp is digits only).
func TestTimestampFirstRefusesAMovedSplit(t *testing.T) {
	t.Parallel()
	key := vectorKey(t)
	ts := time.Unix(vectorTimestamp, 0)
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}, Scheme: webhook.SchemeTimestampFirst, Now: func() time.Time { return ts }})
	require.NoError(t, err)
	const id = "0190f6b2-7c1e-7000-8000-000000000001"
	body := []byte(`{"type":"invoice.extract.completed","data":{}}`)
	h := webhook.Sign(webhook.SchemeTimestampFirst, []webhook.Key{key}, id, ts, body, false)
	_, err = v.Verify(h, body)
	require.NoError(t, err)

	// The forgery: the same signature, the split moved to the first '.' of
	// the body.
	cut := bytes.IndexByte(body, '.')
	forged := h.Clone()
	forged.Set(webhook.IDHeader, id+"."+string(body[:cut]))
	_, err = v.Verify(forged, body[cut+1:])
	require.ErrorIs(t, err, webhook.ErrMalformedHeader)

	// v1 puts the id first and Standard Webhooks lets ids hold a '.': they
	// stay accepted there.
	std := webhook.Sign(webhook.SchemeStandard, []webhook.Key{key}, "msg.1", ts, body, false)
	_, err = verifier(t, ts, key).Verify(std, body)
	require.NoError(t, err)
}

// A Key's secret stays out of every way a Key is commonly written out:
// slog's JSON and text handlers, encoding/json and the fmt verbs.
func TestKeyKeepsItsSecretOutOfLogs(t *testing.T) {
	t.Parallel()
	key := webhook.Key{ID: "k1", Secret: []byte("0123456789abcdef-SECRET-0123456789")}
	forbidden := []string{string(key.Secret), base64.StdEncoding.EncodeToString(key.Secret), webhook.FormatSecret(key.Secret)}
	check := func(what, out string) {
		t.Helper()
		require.Contains(t, out, "k1", "%s names the key", what)
		for _, s := range forbidden {
			require.NotContains(t, out, s, "%s writes the secret", what)
		}
		require.NotContains(t, out, "48 49 50", "%s writes the secret's bytes", what) // %v of a []byte
	}

	var js bytes.Buffer
	slog.New(slog.NewJSONHandler(&js, nil)).Info("rotated", "key", key, "ptr", &key, "keys", []webhook.Key{key})
	check("slog.JSONHandler", js.String())
	var txt bytes.Buffer
	slog.New(slog.NewTextHandler(&txt, nil)).Info("rotated", "key", key)
	check("slog.TextHandler", txt.String())

	b, err := json.Marshal(map[string]any{"key": key, "ptr": &key})
	require.NoError(t, err)
	check("json.Marshal", string(b))
	require.JSONEq(t, `{"key":{"id":"k1"},"ptr":{"id":"k1"}}`, string(b))

	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d"} {
		check(verb, fmt.Sprintf(verb, key))
		check(verb+" of a pointer", fmt.Sprintf(verb, &key))
	}
}
