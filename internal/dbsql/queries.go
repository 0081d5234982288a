package dbsql

import (
	"bufio"
	"fmt"
	"strings"
)

// Queries holds the named statements of one SQL file, already rendered for a
// schema.
type Queries map[string]string

// ParseQueries splits src into statements named by "-- name: X" lines, as
// sqlc files are written, and renders each for schema. A statement runs from
// its name line to the next one; comments inside it are kept because they
// document lock and index choices.
func ParseQueries(src string, schema Schema) (Queries, error) {
	queries := Queries{}
	var name string
	var body strings.Builder
	flush := func() error {
		if name == "" {
			return nil
		}
		sql := strings.TrimSpace(body.String())
		if sql == "" {
			return fmt.Errorf("dbsql: query %q is empty", name)
		}
		if _, dup := queries[name]; dup {
			return fmt.Errorf("dbsql: query %q is defined twice", name)
		}
		queries[name] = schema.Render(sql)
		body.Reset()
		return nil
	}
	scanner := bufio.NewScanner(strings.NewReader(src))
	for scanner.Scan() {
		line := scanner.Text()
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				return nil, fmt.Errorf("dbsql: a name line has no name: %q", line)
			}
			name = fields[0]
			continue
		}
		if name != "" {
			body.WriteString(line)
			body.WriteByte('\n')
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, fmt.Errorf("dbsql: reading queries: %w", err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return queries, nil
}

// Must returns the statement called name. Stores look up every statement
// once, at construction, so a missing one fails there and not mid-request.
func (q Queries) Must(name string) string {
	sql, ok := q[name]
	if !ok {
		panic(fmt.Sprintf("dbsql: no query named %q", name))
	}
	return sql
}
