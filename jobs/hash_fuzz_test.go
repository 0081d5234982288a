package jobs_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
)

// FuzzRequestHash checks that the hash depends on the JSON value only: the
// same document indented, compacted or with its keys in another order hashes
// the same.
//
//	go test -run '^$' -fuzz FuzzRequestHash ./jobs
func FuzzRequestHash(f *testing.F) {
	for _, seed := range []string{`{"b":1,"a":[true,null,"x"]}`, `[{"z":{"y":1.50}}]`, `"s"`, `12e3`, `{"a":"<&>"}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !json.Valid(doc) {
			_, err := jobs.RequestHash(json.RawMessage(doc))
			require.Error(t, err)
			return
		}
		want, err := jobs.RequestHash(json.RawMessage(doc))
		require.NoError(t, err)

		var indented bytes.Buffer
		require.NoError(t, json.Indent(&indented, doc, "", "\t"))
		got, err := jobs.RequestHash(json.RawMessage(indented.Bytes()))
		require.NoError(t, err)
		require.Equal(t, want, got, "indentation changed the hash")

		// Round-trip through Go maps, which reorders object keys.
		var v any
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&v))
		got, err = jobs.RequestHash(v)
		require.NoError(t, err)
		require.Equal(t, want, got, "key order changed the hash")
	})
}
