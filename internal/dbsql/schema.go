package dbsql

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// DefaultSchema is the Postgres schema llmq uses when the host names none.
const DefaultSchema = "llmq"

// MaxSchemaLen bounds schema names so that derived names, such as the
// NOTIFY channels "<schema>_jobs", stay within Postgres' 63-byte limit.
const MaxSchemaLen = 48

// ErrInvalidSchema is returned for a schema name llmq refuses to use.
var ErrInvalidSchema = errors.New("invalid schema name")

// schemaPattern admits lower-case unquoted identifiers only, so a rendered
// name never needs quoting and always means the same thing to Postgres.
var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// Schema is a validated Postgres schema name.
type Schema struct{ name string }

// NewSchema validates name; an empty name means DefaultSchema. "public" and
// the pg_ prefix are refused: llmq never writes to the host's default schema
// or to system schemas.
func NewSchema(name string) (Schema, error) {
	if name == "" {
		name = DefaultSchema
	}
	switch {
	case len(name) > MaxSchemaLen:
		return Schema{}, fmt.Errorf("%w %q: longer than %d bytes", ErrInvalidSchema, name, MaxSchemaLen)
	case !schemaPattern.MatchString(name):
		return Schema{}, fmt.Errorf("%w %q: use lower-case letters, digits and underscores, not starting with a digit", ErrInvalidSchema, name)
	case name == "public" || name == "information_schema" || strings.HasPrefix(name, "pg_"):
		return Schema{}, fmt.Errorf("%w %q: reserved; llmq keeps its tables in a schema of its own", ErrInvalidSchema, name)
	}
	return Schema{name: name}, nil
}

// Name is the schema's name.
func (s Schema) Name() string {
	if s.name == "" {
		return DefaultSchema
	}
	return s.name
}

// schemaMarker is how SQL files mark a table name to be schema-qualified.
const schemaMarker = "/*schema*/"

// Render replaces every /*schema*/ marker in sql with "<schema>.".
func (s Schema) Render(sql string) string {
	return strings.ReplaceAll(sql, schemaMarker, s.Name()+".")
}

// Channel is the NOTIFY channel for topic within this schema, so that two
// llmq installations in one database never wake each other.
func (s Schema) Channel(topic string) string {
	return s.Name() + "_" + topic
}
