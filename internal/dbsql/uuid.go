package dbsql

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// UUID is the form every llmq statement binds a uuid argument in. pgx
// sends a pgtype.UUID in binary where it knows the parameter's type (its
// statement-caching modes) and as text where it does not (its exec and
// simple-protocol modes, which a transaction pooler such as PgBouncer
// before 1.21 requires). The alternatives each fail one of those: pgx has
// no text form for a bare [16]byte without the parameter's type, and a
// uuid.UUID is formatted as a string through driver.Valuer on every call.
//
// Scanning is unaffected: pgx scans a uuid column into a *[16]byte (and so
// into a *uuid.UUID) from binary and from text alike.
func UUID[ID ~[16]byte](id ID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// NullUUID is UUID for an optional id: NULL for nil.
func NullUUID(id *uuid.UUID) pgtype.UUID {
	if id == nil {
		return pgtype.UUID{}
	}
	return UUID(*id)
}

// UUIDs is UUID for a uuid[] argument.
func UUIDs[ID ~[16]byte](ids []ID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(ids))
	for i, id := range ids {
		out[i] = UUID(id)
	}
	return out
}
