// Package sqlfile loads the examples' own SQL files: statements named by
// "-- name: X" lines, as sqlc files are written, each running to the next
// name line, with /*schema*/ replaced by the quoted schema name and a dot.
// It is example scaffolding: a service uses its own way of holding SQL.
//
// It is under examples/internal, which a program outside this module
// cannot import: a service copying an example copies this package with it
// (it imports only public packages; TestExamplesImportOnlyWhatAHostCan in
// the module's root checks that every example does too).
package sqlfile

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema of an empty name, as in llmq's own configs.
const DefaultSchema = "llmq"

// Queries maps statement names to their SQL, rendered for one schema.
type Queries map[string]string

// Must returns the named statement; a missing one is a programming error.
func (q Queries) Must(name string) string {
	sql, ok := q[name]
	if !ok {
		panic(fmt.Sprintf("sqlfile: no statement named %q", name))
	}
	return sql
}

// Load splits src into its named statements, rendered for schema
// (DefaultSchema when empty). Text before the first name line is a header
// comment and is dropped; a name used twice or a statement left empty is
// an error.
func Load(schema, src string) (Queries, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	prefix := pgx.Identifier{schema}.Sanitize() + "."
	q := Queries{}
	name := ""
	var body strings.Builder
	flush := func() error {
		if name == "" {
			return nil
		}
		sql := strings.TrimSpace(body.String())
		if sql == "" {
			return fmt.Errorf("sqlfile: statement %q is empty", name)
		}
		if _, dup := q[name]; dup {
			return fmt.Errorf("sqlfile: statement %q is defined twice", name)
		}
		q[name] = strings.ReplaceAll(sql, "/*schema*/", prefix)
		return nil
	}
	for line := range strings.Lines(src) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			name, _, _ = strings.Cut(strings.TrimSpace(rest), " ")
			body.Reset()
			continue
		}
		body.WriteString(line)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return q, nil
}
