package dbsql

import (
	"fmt"
	"slices"
	"strings"
)

// Spec is the Go side of one named statement: where its rendered SQL goes,
// how many arguments the code binds, and what it scans each result row into.
// Build specs with Exec and Query and hand them to Load.
type Spec struct {
	dst   *string
	name  string
	args  int
	dests []any
	binds []any
	query bool
	// discard: run with Exec although it returns a row.
	discard bool
	// script: several statements without arguments, run with Exec.
	script bool
}

// Exec declares a statement that returns no rows and binds args arguments.
func Exec(dst *string, name string, args int) Spec {
	return Spec{dst: dst, name: name, args: args}
}

// Discard declares a statement the code runs with Exec although it returns
// a row, such as a SELECT of set_config or pg_advisory_xact_lock: its
// columns are not checked.
func Discard(dst *string, name string, args int) Spec {
	return Spec{dst: dst, name: name, args: args, discard: true}
}

// Script declares several statements without arguments, run together
// with Exec, such as the idempotent DDL an example creates its own tables
// with. Postgres cannot prepare them, so dbsqltest runs them instead, on
// its fresh schema, before it checks the other statements: a script must
// be safe to run there.
func Script(dst *string, name string) Spec {
	return Spec{dst: dst, name: name, script: true}
}

// Query declares a statement that returns rows, binds args arguments and
// scans each row into dests, in order. dests must be what the code scans:
// for a wide row, the result of the same function the scan calls (for
// example eventDest(new(Event))), so that a column added to the statement
// but not to that function fails the check in dbsqltest.
func Query(dst *string, name string, args int, dests ...any) Spec {
	return Spec{dst: dst, name: name, args: args, dests: dests, query: true}
}

// Binds declares the Go types of the statement's arguments by example
// values, in order: dbsqltest checks that pgx can encode each for its
// parameter's type. Declare them where a type is easily wrong, such as the
// arrays a batch statement binds; a statement without them has only its
// argument count checked.
func (s Spec) Binds(examples ...any) Spec {
	s.binds = examples
	return s
}

// BindTypes are the example arguments Binds declared, nil when none.
func (s Spec) BindTypes() []any { return s.binds }

// Name is the statement's name in its SQL file.
func (s Spec) Name() string { return s.name }

// Args is how many arguments the code binds.
func (s Spec) Args() int { return s.args }

// Dests are the scan destinations the code declares, nil for Exec.
func (s Spec) Dests() []any { return s.dests }

// ReturnsRows says whether the statement was declared with Query.
func (s Spec) ReturnsRows() bool { return s.query }

// Discards says whether the statement was declared with Discard.
func (s Spec) Discards() bool { return s.discard }

// IsScript says whether the statement was declared with Script.
func (s Spec) IsScript() bool { return s.script }

// SQL is the rendered statement, once Load has run.
func (s Spec) SQL() string {
	if s.dst == nil {
		return ""
	}
	return *s.dst
}

// Set is the specs of one package, loaded.
type Set struct {
	Schema Schema
	Specs  []Spec
}

// SQL is the rendered statement named name, and whether the set has one:
// what plan tests EXPLAIN.
func (s Set) SQL(name string) (string, bool) {
	for _, spec := range s.Specs {
		if spec.Name() == name {
			return spec.SQL(), true
		}
	}
	return "", false
}

// Load parses the package's SQL files (srcs, one text per file, whose names
// must not repeat across them), renders them for schema, and stores every
// declared statement's SQL in its destination. It fails when a spec names a
// statement no file defines, when two specs name one statement, and when a
// file defines a statement no spec declares: a package's statements and its
// Go code describe each other exactly, and a mismatch stops construction
// rather than a request.
func Load(schema Schema, srcs []string, specs ...Spec) (Set, error) {
	q, err := ParseQueries(strings.Join(srcs, "\n"), schema)
	if err != nil {
		return Set{}, err
	}
	claimed := make(map[string]bool, len(specs))
	for _, s := range specs {
		sql, ok := q[s.name]
		switch {
		case !ok:
			return Set{}, fmt.Errorf("dbsql: no statement named %q", s.name)
		case claimed[s.name]:
			return Set{}, fmt.Errorf("dbsql: statement %q is declared twice", s.name)
		case s.dst == nil:
			return Set{}, fmt.Errorf("dbsql: statement %q has no destination", s.name)
		}
		claimed[s.name] = true
		*s.dst = sql
	}
	var unclaimed []string
	for name := range q {
		if !claimed[name] {
			unclaimed = append(unclaimed, name)
		}
	}
	if len(unclaimed) > 0 {
		slices.Sort(unclaimed)
		return Set{}, fmt.Errorf("dbsql: statements no Go code declares: %s", strings.Join(unclaimed, ", "))
	}
	return Set{Schema: schema, Specs: specs}, nil
}
