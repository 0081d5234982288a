// Package dbsqltest checks a package's SQL against its Go code before
// anything runs: every named statement is prepared on a freshly migrated
// schema, and Postgres' description of it (parameter types, result columns)
// is compared with the dbsql.Spec the Go code declared. One call per package
// covers all its statements:
//
//	func TestStatements(t *testing.T) {
//		t.Parallel()
//		var q statements
//		dbsqltest.Check(t, &q, q.load)
//	}
package dbsqltest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/dbtest"
)

// Loader loads a package's statements for a schema, as its constructors do.
type Loader func(dbsql.Schema) (dbsql.Set, error)

// Check loads the package's statements into stmts (a pointer to the
// package's struct of statement strings) for a freshly migrated schema and
// fails t once for every statement whose shape differs from its spec, and
// once for every string field of stmts that no spec filled.
func Check(t *testing.T, stmts any, load Loader) {
	t.Helper()
	db := dbtest.Setup(t)
	schema, err := dbsql.NewSchema(db.Schema)
	if err != nil {
		t.Fatalf("dbsqltest: %v", err)
	}
	set, err := load(schema)
	if err != nil {
		t.Fatalf("dbsqltest: loading statements: %v", err)
	}
	for _, field := range Unfilled(stmts) {
		t.Errorf("dbsqltest: field %s is filled by no spec", field)
	}
	conn, err := db.Pool.Acquire(t.Context())
	if err != nil {
		t.Fatalf("dbsqltest: %v", err)
	}
	defer conn.Release()
	for _, err := range Verify(t.Context(), conn.Conn(), set) {
		t.Error(err)
	}
}

// Unfilled returns the names of the empty string fields of the struct stmts
// points to: statements the code would run as empty SQL.
func Unfilled(stmts any) []string {
	v := reflect.ValueOf(stmts)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return []string{fmt.Sprintf("(stmts is a %T, not a pointer to a struct)", stmts)}
	}
	v = v.Elem()
	var empty []string
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.String && f.String() == "" {
			empty = append(empty, v.Type().Field(i).Name)
		}
	}
	return empty
}

// ErrMismatch marks a statement whose shape differs from its spec.
var ErrMismatch = errors.New("statement does not match its Go code")

// Verify runs set's scripts on conn, then describes every other statement
// and returns one error per statement that fails to run or to prepare, or
// differs from its spec: a parameter count other than the spec's argument
// count, an argument declared with Binds that cannot be encoded for its
// parameter, a result on a statement declared with Exec, or result columns
// that differ in number from the spec's destinations or cannot be scanned
// into them.
func Verify(ctx context.Context, conn *pgx.Conn, set dbsql.Set) []error {
	var errs []error
	for _, spec := range set.Specs {
		if !spec.IsScript() {
			continue
		}
		if _, err := conn.Exec(ctx, spec.SQL()); err != nil {
			errs = append(errs, fmt.Errorf("statement %s: script fails: %w", spec.Name(), err))
		}
	}
	for _, spec := range set.Specs {
		if spec.IsScript() {
			continue
		}
		desc, err := conn.PgConn().Prepare(ctx, "", spec.SQL(), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("statement %s: does not prepare: %w", spec.Name(), err))
			continue
		}
		if err := compare(conn.TypeMap(), spec, desc); err != nil {
			errs = append(errs, fmt.Errorf("statement %s: %w", spec.Name(), err))
		}
	}
	return errs
}

func compare(m *pgtype.Map, spec dbsql.Spec, desc *pgconn.StatementDescription) error {
	var problems []string
	if len(desc.ParamOIDs) != spec.Args() {
		problems = append(problems, fmt.Sprintf("takes %d parameters (%s), the Go code binds %d",
			len(desc.ParamOIDs), typeNames(m, desc.ParamOIDs), spec.Args()))
	}
	problems = append(problems, bindProblems(m, spec, desc.ParamOIDs)...)
	switch {
	case spec.Discards():
	case !spec.ReturnsRows() && len(desc.Fields) > 0:
		problems = append(problems, fmt.Sprintf("returns columns (%s) but is declared with Exec", columns(m, desc.Fields)))
	case spec.ReturnsRows() && len(desc.Fields) != len(spec.Dests()):
		problems = append(problems, fmt.Sprintf("returns %d columns, the Go code scans %d\n\tcolumns: %s\n\tscans:   %s",
			len(desc.Fields), len(spec.Dests()), columns(m, desc.Fields), goTypes(spec.Dests())))
	case spec.ReturnsRows():
		for i, f := range desc.Fields {
			if !scannable(m, f.DataTypeOID, spec.Dests()[i]) {
				problems = append(problems, fmt.Sprintf("column %d %s %s cannot be scanned into %T",
					i+1, f.Name, typeName(m, f.DataTypeOID), spec.Dests()[i]))
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrMismatch, strings.Join(problems, "; "))
}

// bindProblems checks the argument types spec declares with Binds, if any.
func bindProblems(m *pgtype.Map, spec dbsql.Spec, oids []uint32) []string {
	binds := spec.BindTypes()
	if binds == nil {
		return nil
	}
	if len(binds) != len(oids) {
		return []string{fmt.Sprintf("declares %d argument types for %d parameters", len(binds), len(oids))}
	}
	var problems []string
	for i, oid := range oids {
		if m.PlanEncode(oid, m.FormatCodeForOID(oid), binds[i]) == nil {
			problems = append(problems, fmt.Sprintf("parameter $%d %s cannot be bound from %T", i+1, typeName(m, oid), binds[i]))
		} else if p := dbtest.TextProblem(m, oid, binds[i]); p != "" {
			problems = append(problems, fmt.Sprintf("parameter $%d: %s (pgx's exec and simple-protocol modes)", i+1, p))
		}
	}
	return problems
}

// scannable asks pgx for a plan to scan a value of oid into dest, in the
// format pgx itself requests for that type and in text, the format of
// every result in pgx's exec and simple-protocol modes.
func scannable(m *pgtype.Map, oid uint32, dest any) bool {
	if dest == nil || reflect.TypeOf(dest).Kind() != reflect.Pointer {
		return false
	}
	// pgx returns its unexported failing plan when no plan fits; it has no
	// exported way to ask.
	fails := func(format int16) bool {
		return fmt.Sprintf("%T", m.PlanScan(oid, format, dest)) == "*pgtype.scanPlanFail"
	}
	return !fails(m.FormatCodeForOID(oid)) && !fails(pgtype.TextFormatCode)
}

func columns(m *pgtype.Map, fields []pgconn.FieldDescription) string {
	parts := make([]string, len(fields))
	for i, f := range fields {
		parts[i] = f.Name + " " + typeName(m, f.DataTypeOID)
	}
	return strings.Join(parts, ", ")
}

func typeNames(m *pgtype.Map, oids []uint32) string {
	parts := make([]string, len(oids))
	for i, oid := range oids {
		parts[i] = fmt.Sprintf("$%d %s", i+1, typeName(m, oid))
	}
	return strings.Join(parts, ", ")
}

func typeName(m *pgtype.Map, oid uint32) string {
	if typ, ok := m.TypeForOID(oid); ok {
		return typ.Name
	}
	return fmt.Sprintf("oid %d", oid)
}

func goTypes(dests []any) string {
	parts := make([]string, len(dests))
	for i, d := range dests {
		parts[i] = fmt.Sprintf("%T", d)
	}
	return strings.Join(parts, ", ")
}
