package dbsql

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewSchema(t *testing.T) {
	t.Parallel()
	s, err := NewSchema("")
	require.NoError(t, err)
	require.Equal(t, DefaultSchema, s.Name())
	require.Equal(t, DefaultSchema, Schema{}.Name(), "the zero Schema is the default")

	s, err = NewSchema("tenant_a_jobs2")
	require.NoError(t, err)
	require.Equal(t, "SELECT * FROM tenant_a_jobs2.jobs", s.Render("SELECT * FROM /*schema*/jobs"))
	require.Equal(t, "tenant_a_jobs2_jobs", s.Channel("jobs"))

	for _, bad := range []string{"public", "pg_temp", "information_schema", "Jobs", "9lives", "a-b", "a b", `a"b`, "a;b", strings.Repeat("x", MaxSchemaLen+1)} {
		_, err := NewSchema(bad)
		require.ErrorIs(t, err, ErrInvalidSchema, bad)
	}
}

func TestParseQueries(t *testing.T) {
	t.Parallel()
	schema, err := NewSchema("s")
	require.NoError(t, err)
	q, err := ParseQueries(`-- a header comment, not a query
-- name: One :one
-- the lock choice is explained here
SELECT 1 FROM /*schema*/t;

-- name: Two
SELECT 2;
`, schema)
	require.NoError(t, err)
	require.Equal(t, "-- the lock choice is explained here\nSELECT 1 FROM s.t;", q["One"])
	require.Equal(t, "SELECT 2;", q["Two"])
	require.NotContains(t, q, "Three")

	_, err = ParseQueries("-- name: A\nSELECT 1;\n-- name: A\nSELECT 2;", schema)
	require.ErrorContains(t, err, "twice")
	_, err = ParseQueries("-- name: A\n\n-- name: B\nSELECT 1;", schema)
	require.ErrorContains(t, err, "empty")
	_, err = ParseQueries("-- name:\nSELECT 1;", schema)
	require.ErrorContains(t, err, "no name")
}

func TestNullIfZero(t *testing.T) {
	t.Parallel()
	require.Nil(t, NullIfZero(""))
	require.Equal(t, "x", *NullIfZero("x"))
	require.Equal(t, "x", Deref(NullIfZero("x")))
	require.Zero(t, Deref[int](nil))
}

// A batch statement maps every row's optional columns: the zero value,
// the common case, costs no allocation. Not parallel: testing.AllocsPerRun
// refuses to run beside other tests, whose allocations it would count.
//
//nolint:paralleltest // AllocsPerRun panics in a parallel test
func TestNullIfZeroAllocatesOnlyForAValue(t *testing.T) {
	column := make([]*string, 1) // as a batch statement's argument holds them
	require.Zero(t, testing.AllocsPerRun(100, func() { column[0] = NullIfZero("") }))
	require.InDelta(t, 1, testing.AllocsPerRun(100, func() { column[0] = NullIfZero("x") }), 0)
}

func TestParseQueriesFragments(t *testing.T) {
	t.Parallel()
	schema, err := NewSchema("s")
	require.NoError(t, err)
	q, err := ParseQueries(`-- fragment: cols
-- a comment about the list
a, b,
c
-- name: Plain
SELECT /*cols*/ FROM /*schema*/t;
-- name: Qualified
UPDATE /*schema*/t AS x SET a = 1 FROM u RETURNING /*cols x*/;
`, schema)
	require.NoError(t, err)
	require.Equal(t, "SELECT a, b, c FROM s.t;", q["Plain"])
	require.Equal(t, "UPDATE s.t AS x SET a = 1 FROM u RETURNING x.a, x.b, x.c;", q["Qualified"])
	_, isQuery := q["cols"]
	require.False(t, isQuery, "a fragment is not a query")

	_, err = ParseQueries("-- name: A\nSELECT /*nope*/ FROM t;", schema)
	require.ErrorContains(t, err, "undefined fragment")
}

func TestParseQueriesBlocks(t *testing.T) {
	t.Parallel()
	schema, err := NewSchema("s")
	require.NoError(t, err)
	q, err := ParseQueries(`-- fragment: cols
a, b
-- block: audit
-- writes the audit row
audit AS (INSERT INTO /*schema*/log SELECT /*cols*/ FROM changed),
-- name: One
WITH changed AS (UPDATE /*schema*/t SET a = 1 RETURNING /*cols*/),
/*audit*/
done AS (SELECT 1)
SELECT 1;
`, schema)
	require.NoError(t, err)
	require.Equal(t, "WITH changed AS (UPDATE s.t SET a = 1 RETURNING a, b),\n"+
		"-- writes the audit row\naudit AS (INSERT INTO s.log SELECT a, b FROM changed),\n"+
		"done AS (SELECT 1)\nSELECT 1;", q["One"])
	_, isQuery := q["audit"]
	require.False(t, isQuery, "a block is not a query")

	_, err = ParseQueries("-- block: b\nx AS (SELECT 1),\n-- name: A\nWITH /*b y*/ SELECT 1;", schema)
	require.ErrorContains(t, err, "qualifies block")
	nested, err := ParseQueries("-- block: b\nx AS (SELECT 1),\n-- block: c\n/*b*/ y AS (SELECT 2),\n-- name: A\nWITH /*c*/ SELECT 1;", schema)
	require.NoError(t, err, "a block uses the blocks above it")
	require.Equal(t, "WITH x AS (SELECT 1), y AS (SELECT 2), SELECT 1;", nested["A"])
	_, err = ParseQueries("-- block: c\n/*b*/\n-- block: b\nx AS (SELECT 1),\n-- name: A\nWITH /*c*/ SELECT 1;", schema)
	require.ErrorContains(t, err, "undefined fragment", "a block uses no block below it")
}

func TestLoad(t *testing.T) {
	t.Parallel()
	schema, err := NewSchema("s")
	require.NoError(t, err)
	files := []string{"-- name: A\nSELECT a FROM /*schema*/t;", "-- name: B\nDELETE FROM /*schema*/t;"}
	var q struct{ a, b string }
	var a int
	set, err := Load(schema, files, Query(&q.a, "A", 0, &a), Exec(&q.b, "B", 0))
	require.NoError(t, err)
	require.Equal(t, "SELECT a FROM s.t;", q.a)
	require.Equal(t, "DELETE FROM s.t;", q.b)
	require.Len(t, set.Specs, 2)
	require.Equal(t, q.a, set.Specs[0].SQL())

	_, err = Load(schema, files, Query(&q.a, "A", 0, &a))
	require.ErrorContains(t, err, "statements no Go code declares: B")
	_, err = Load(schema, files, Query(&q.a, "A", 0, &a), Exec(&q.b, "B", 0), Exec(&q.b, "C", 0))
	require.ErrorContains(t, err, `no statement named "C"`)
	_, err = Load(schema, files, Query(&q.a, "A", 0, &a), Exec(&q.b, "B", 0), Exec(&q.b, "A", 0))
	require.ErrorContains(t, err, `"A" is declared twice`)
	_, err = Load(schema, files, Query(nil, "A", 0, &a), Exec(&q.b, "B", 0))
	require.ErrorContains(t, err, "no destination")
}

// ParseQueries reads only files embedded at build time, but a malformed one
// must fail with an error, never a panic or an empty statement.
func FuzzParseQueries(f *testing.F) {
	f.Add("-- fragment: cols\na, b\n-- name: A\nSELECT /*cols x*/ FROM /*schema*/t;\n-- name: B\nSELECT 1;")
	f.Add("-- name: A\n\n-- name: B\nSELECT 1;")
	f.Add("-- name:\nSELECT /*nope*/;")
	f.Add("-- block: b\nx AS (SELECT /*schema*/t),\n-- name: A\nWITH /*b*/ SELECT 1;")
	schema, err := NewSchema("s")
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, src string) {
		q, err := ParseQueries(src, schema)
		if err != nil {
			return
		}
		for name, sql := range q {
			require.NotEmpty(t, name)
			require.NotEmpty(t, sql, name)
			require.NotContains(t, sql, "/*schema*/", name)
		}
	})
}
