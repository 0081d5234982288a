package dbsql

import "encoding/json"

// RawJSON returns p as the destination pgx copies a jsonb value into as it
// came. Scanned into a *json.RawMessage itself, the value would pass through
// json.Unmarshal, which parses all of it once more only to copy it: for a
// payload of 4 KB that doubles the client's time per row. PostgreSQL has
// already checked a jsonb value, and NULL leaves *p nil either way.
func RawJSON(p *json.RawMessage) *[]byte { return (*[]byte)(p) }
