package migrate

import (
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
)

func TestLoadEmbedded(t *testing.T) {
	t.Parallel()
	schema, err := dbsql.NewSchema("custom")
	require.NoError(t, err)
	m, err := New(schema)
	require.NoError(t, err)
	for i, mig := range m.Migrations() {
		require.Equal(t, i+1, mig.Version)
		require.NotContains(t, mig.Up, "/*schema*/", "every marker is rendered")
		require.NotContains(t, mig.Down, "/*schema*/")
		require.NotContains(t, mig.Up, "llmq.", "no table escapes the chosen schema")
	}
}

func TestLoadRejectsBrokenSets(t *testing.T) {
	t.Parallel()
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	tests := map[string]fstest.MapFS{
		"not NNNN_name": {"sql/1_init.up.sql": file("x"), "sql/1_init.down.sql": file("x")},
		"without gaps":  {"sql/0001_a.up.sql": file("x"), "sql/0001_a.down.sql": file("x"), "sql/0003_c.up.sql": file("x"), "sql/0003_c.down.sql": file("x")},
		"up and a down": {"sql/0001_a.up.sql": file("x")},
		"two names":     {"sql/0001_a.up.sql": file("x"), "sql/0001_b.down.sql": file("x")},
		"no embedded":   {"sql": &fstest.MapFile{Mode: fs.ModeDir | 0o755}},
		"reading embed": {},
	}
	for want, fsys := range tests {
		_, err := load(fsys, dbsql.Schema{})
		require.ErrorContains(t, err, want)
	}
}
