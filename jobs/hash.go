package jobs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// RequestHash returns a canonical hash of v for EnqueueParams.RequestHash:
// "sha256:" and the hex SHA-256 of v's JSON with object keys sorted and
// insignificant white space removed, so the same request hashes the same
// however its JSON was written. Numbers keep their literal text (1 and 1.0
// differ).
//
// Hash what changes the result (document digest and version, schema, model
// policy, options), never what does not (a signed URL, a file name, a
// timestamp of the request): the hash decides whether a retried request is
// the same request.
func RequestHash(v any) (string, error) {
	hash, err := canonicalHash(v)
	if err != nil {
		return "", fmt.Errorf("jobs: request hash: %w", err)
	}
	return hash, nil
}

// canonicalHash is "sha256:" and the hex SHA-256 of v's JSON with object
// keys sorted and insignificant white space removed.
func canonicalHash(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return "", err
	}
	// encoding/json writes map keys sorted and json.Number verbatim, which
	// makes this re-encoding canonical.
	canonical, err := json.Marshal(generic)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
