package dbsqltest_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbsql/dbsqltest"
	"github.com/llmq/llmq/internal/dbtest"
)

// The statements are read from the migrated schema's own migrations
// table, so the test needs no table of its own.
const src = `
-- name: Versions
SELECT version, applied_at FROM /*schema*/migrations WHERE version > $1;
-- name: Forget
DELETE FROM /*schema*/migrations WHERE version = $1;
`

type migration struct {
	version int32
	applied time.Time
}

// migrationDest is what the Go side scans Versions into.
func migrationDest(m *migration) []any { return []any{&m.version, &m.applied} }

type statements struct{ versions, forget string }

func (q *statements) load(schema dbsql.Schema, src string) (dbsql.Set, error) {
	return q.loadBinding(schema, src, int32(0))
}

// loadBinding declares Forget's argument type by the example forgetArg.
func (q *statements) loadBinding(schema dbsql.Schema, src string, forgetArg any) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{src},
		dbsql.Query(&q.versions, "Versions", 1, migrationDest(new(migration))...),
		dbsql.Exec(&q.forget, "Forget", 1).Binds(forgetArg),
	)
}

func verify(t *testing.T, src string) []error {
	t.Helper()
	return verifyBinding(t, src, int32(0))
}

func verifyBinding(t *testing.T, src string, forgetArg any) []error {
	t.Helper()
	db := dbtest.Setup(t)
	schema, err := dbsql.NewSchema(db.Schema)
	require.NoError(t, err)
	var q statements
	set, err := q.loadBinding(schema, src, forgetArg)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	return dbsqltest.Verify(t.Context(), conn.Conn(), set)
}

func TestCheckPassesAlignedStatements(t *testing.T) {
	t.Parallel()
	var q statements
	dbsqltest.Check(t, &q, func(s dbsql.Schema) (dbsql.Set, error) { return q.load(s, src) })
}

func TestUnfilledNamesFieldsNoSpecFilled(t *testing.T) {
	t.Parallel()
	var q struct{ versions, forget, added string }
	q.versions, q.forget = "SELECT 1", "SELECT 2"
	require.Equal(t, []string{"added"}, dbsqltest.Unfilled(&q))
	require.Len(t, dbsqltest.Unfilled(q), 1, "not a pointer")
}

// The target: a column added to a query but not to its scan fails,
// naming the statement and both sides.
func TestCheckFailsAColumnAddedToAQueryButNotToItsScan(t *testing.T) {
	t.Parallel()
	misaligned := `
-- name: Versions
SELECT version, applied_at, applied_at AS again FROM /*schema*/migrations WHERE version > $1;
-- name: Forget
DELETE FROM /*schema*/migrations WHERE version = $1;
`
	errs := verify(t, misaligned)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], dbsqltest.ErrMismatch)
	require.Equal(t, "statement Versions: statement does not match its Go code: returns 3 columns, the Go code scans 2\n"+
		"\tcolumns: version int4, applied_at timestamptz, again timestamptz\n"+
		"\tscans:   *int32, *time.Time", errs[0].Error())
}

func TestCheckFailsParametersResultsAndTypes(t *testing.T) {
	t.Parallel()
	wrong := `
-- name: Versions
SELECT applied_at, version FROM /*schema*/migrations WHERE version > $1 AND applied_at < $2;
-- name: Forget
DELETE FROM /*schema*/migrations WHERE version = $1 RETURNING version;
`
	errs := verify(t, wrong)
	require.Len(t, errs, 2)
	require.ErrorContains(t, errs[0], "statement Versions: ")
	require.ErrorContains(t, errs[0], "takes 2 parameters ($1 int4, $2 timestamptz), the Go code binds 1")
	require.ErrorContains(t, errs[0], "column 1 applied_at timestamptz cannot be scanned into *int32")
	require.ErrorContains(t, errs[0], "column 2 version int4 cannot be scanned into *time.Time")
	require.ErrorContains(t, errs[1], "statement Forget: statement does not match its Go code: returns columns (version int4) but is declared with Exec")
}

func TestCheckFailsAStatementThatDoesNotPrepare(t *testing.T) {
	t.Parallel()
	errs := verify(t, "-- name: Versions\nSELECT nope FROM /*schema*/migrations WHERE version > $1;\n-- name: Forget\nSELECT $1::int;")
	require.Len(t, errs, 2)
	require.ErrorContains(t, errs[0], "statement Versions: does not prepare")
	require.ErrorContains(t, errs[1], "statement Forget: ")
}

func TestCheckFailsAnArgumentTypeThatCannotBeBound(t *testing.T) {
	t.Parallel()
	errs := verifyBinding(t, src, time.Time{})
	require.Len(t, errs, 1)
	require.EqualError(t, errs[0], "statement Forget: statement does not match its Go code: parameter $1 int4 cannot be bound from time.Time")
}

// Scripts run before the other statements are described, so statements
// may read the tables a script creates; a failing script is reported.
func TestCheckRunsScriptsFirst(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	schema, err := dbsql.NewSchema(db.Schema)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	var q struct{ create, read, broken string }
	set, err := dbsql.Load(schema, []string{`
-- name: Read
SELECT note FROM /*schema*/notes;
-- name: Create
CREATE TABLE IF NOT EXISTS /*schema*/notes (note text); CREATE INDEX IF NOT EXISTS notes_note ON /*schema*/notes (note);
-- name: Broken
CREATE TABLE /*schema*/nowhere.x (a int); SELECT 1;
`}, dbsql.Query(&q.read, "Read", 0, new(string)), dbsql.Script(&q.create, "Create"), dbsql.Script(&q.broken, "Broken"))
	require.NoError(t, err)
	errs := dbsqltest.Verify(t.Context(), conn.Conn(), set)
	require.Len(t, errs, 1)
	require.ErrorContains(t, errs[0], "statement Broken: script fails")
}

// pgx's exec and simple-protocol modes, which a transaction pooler needs,
// send every argument as text without its parameter's type: an argument
// must encode without it, and to the same text as with it.
func TestCheckFailsAnArgumentTheTextModesCannotSend(t *testing.T) {
	t.Parallel()
	byID := `
-- name: Versions
SELECT version, applied_at FROM /*schema*/migrations WHERE version > $1;
-- name: Forget
DELETE FROM /*schema*/migrations WHERE md5(version::text)::uuid = $1;
`
	errs := verifyBinding(t, byID, [16]byte{})
	require.Len(t, errs, 1)
	require.EqualError(t, errs[0], "statement Forget: statement does not match its Go code: "+
		"parameter $1: [16]uint8 cannot be encoded without the parameter's type (uuid) (pgx's exec and simple-protocol modes)")
	require.Empty(t, verifyBinding(t, byID, pgtype.UUID{Bytes: [16]byte{1}, Valid: true}))

	byNote := `
-- name: Versions
SELECT version, applied_at FROM /*schema*/migrations WHERE version > $1;
-- name: Forget
DELETE FROM /*schema*/migrations WHERE to_jsonb(version) = $1;
`
	errs = verifyBinding(t, byNote, []byte("7"))
	require.Len(t, errs, 1)
	require.EqualError(t, errs[0], "statement Forget: statement does not match its Go code: "+
		`parameter $1: []uint8 is sent as "\\x37" without the parameter's type (jsonb), as "7" with it (pgx's exec and simple-protocol modes)`)
	require.Empty(t, verifyBinding(t, byNote, json.RawMessage("7")))
}

// Results come back as text in pgx's exec and simple-protocol modes: a
// destination must scan from text as well as in the format pgx prefers.
// pgx scans every destination llmq uses from both; a codec that cannot
// scan text stands here for one that might not.
func TestCheckFailsAColumnThatCannotBeScannedFromText(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	schema, err := dbsql.NewSchema(db.Schema)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(t.Context())
	require.NoError(t, err)
	defer conn.Release()
	var q struct{ read string }
	set, err := dbsql.Load(schema, []string{"-- name: Read\nSELECT version FROM /*schema*/migrations;\n"},
		dbsql.Query(&q.read, "Read", 0, new(int32)))
	require.NoError(t, err)
	require.Empty(t, dbsqltest.Verify(t.Context(), conn.Conn(), set))

	conn.Conn().TypeMap().RegisterType(&pgtype.Type{Name: "int4", OID: pgtype.Int4OID, Codec: binaryOnly{pgtype.Int4Codec{}}})
	errs := dbsqltest.Verify(t.Context(), conn.Conn(), set)
	require.Len(t, errs, 1)
	require.ErrorContains(t, errs[0], "column 1 version int4 cannot be scanned into *int32")
	// The connection's type map is changed for good: it must not return
	// to the pool.
	require.NoError(t, conn.Conn().Close(t.Context()))
}

// binaryOnly is a codec that scans nothing from text.
type binaryOnly struct{ pgtype.Int4Codec }

func (c binaryOnly) PlanScan(m *pgtype.Map, oid uint32, format int16, target any) pgtype.ScanPlan {
	if format == pgtype.TextFormatCode {
		return nil
	}
	return c.Int4Codec.PlanScan(m, oid, format, target)
}
