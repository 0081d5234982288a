package sqlfile_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/internal/sqlfile"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	q, err := sqlfile.Load("shop", "-- a header\n-- name: One :one\n-- why\nSELECT 1 FROM /*schema*/t;\n\n-- name: Two\nSELECT 2;\n")
	require.NoError(t, err)
	require.Equal(t, "-- why\nSELECT 1 FROM \"shop\".t;", q.Must("One"))
	require.Equal(t, "SELECT 2;", q["Two"])
	require.Panics(t, func() { q.Must("Three") })

	q, err = sqlfile.Load("", "-- name: A\nSELECT * FROM /*schema*/t;")
	require.NoError(t, err)
	require.Equal(t, `SELECT * FROM "llmq".t;`, q.Must("A"))

	_, err = sqlfile.Load("s", "-- name: A\nSELECT 1;\n-- name: A\nSELECT 2;")
	require.ErrorContains(t, err, "twice")
	_, err = sqlfile.Load("s", "-- name: A\n\n-- name: B\nSELECT 1;")
	require.ErrorContains(t, err, "empty")
}

func FuzzLoad(f *testing.F) {
	f.Add("s", "-- name: A\nSELECT 1 FROM /*schema*/t;")
	f.Fuzz(func(t *testing.T, schema, src string) {
		q, err := sqlfile.Load(schema, src)
		if err == nil {
			for _, sql := range q {
				require.NotContains(t, sql, "/*schema*/")
			}
		}
	})
}
