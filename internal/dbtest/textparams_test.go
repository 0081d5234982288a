package dbtest

import (
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// The tracer of every fixture's pool reports each argument pgx's exec and
// simple-protocol modes would send wrongly or not at all, once per
// statement and argument, in queries and batches alike.
func TestTextParamsReportsArgumentsTheTextModesCannotSend(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(URL())
	require.NoError(t, err)
	// The default mode, whatever DATABASE_URL says: it encodes a [16]byte
	// (in binary, knowing the parameter's type) where the text modes fail.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	params := newTextParams(cfg.ConnConfig)
	cfg.ConnConfig.Tracer = params
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	defer pool.Close()

	const byID, byJSON = "SELECT $1::uuid IS NOT NULL", "SELECT $1::jsonb IS NOT NULL"
	var ok bool
	id := [16]byte{1, 2, 3}
	for range 2 {
		require.NoError(t, pool.QueryRow(t.Context(), byID, id).Scan(&ok), "the default mode sends it in binary")
	}
	require.NoError(t, pool.QueryRow(t.Context(), byID, pgtype.UUID{Bytes: id, Valid: true}).Scan(&ok))
	b := &pgx.Batch{}
	b.Queue(byJSON, []byte(`{"a":1}`))
	b.Queue(byJSON, json.RawMessage(`{"a":1}`))
	b.Queue(byJSON, `{"a":1}`)
	require.NoError(t, pool.SendBatch(t.Context(), b).Close())

	require.Equal(t, []string{
		"argument $1: [16]uint8 cannot be encoded without the parameter's type (uuid)\n\tin: " + byID,
		`argument $1: []uint8 is sent as "\\x7b2261223a317d" without the parameter's type (jsonb), as "{\"a\":1}" with it` + "\n\tin: " + byJSON,
	}, params.problems)
}
