package dbsql

import (
	"bufio"
	"fmt"
	"regexp"
	"strings"
)

// Queries holds the named statements of one SQL file, already rendered for a
// schema. New code holds statements in a struct filled by Load instead (see
// the package documentation); Queries remains for packages not converted.
type Queries map[string]string

// ParseQueries splits src into statements named by "-- name: X" lines, as
// sqlc files are written, and renders each for schema. A statement runs from
// its name line to the next name or fragment line; comments inside it are
// kept because they document lock and index choices.
//
// A "-- fragment: F" block defines a comma-separated column list once;
// statements insert it with /*F*/, or with /*F alias*/ to qualify every
// column with alias. Fragments keep long column lists, which must match the
// code that scans them, in one place.
//
// A "-- block: B" defines a run of SQL once, inserted as it is (comments
// included) where a statement says /*B*/: the same CTEs that several
// statements end with, kept in one place so that a fix reaches every one
// of them. A block may use fragments, the schema marker and the blocks
// defined above it in the file.
func ParseQueries(src string, schema Schema) (Queries, error) {
	blocks, err := splitBlocks(src)
	if err != nil {
		return nil, err
	}
	fragments := map[string][]string{}
	for _, b := range blocks {
		if b.kind == fragmentBlock {
			fragments[b.name] = fragmentColumns(b.body)
		}
	}
	texts := map[string]string{}
	for _, b := range blocks {
		if b.kind == textBlock {
			text, err := expandFragments(b.name, b.body, fragments, texts)
			if err != nil {
				return nil, err
			}
			texts[b.name] = text
		}
	}
	queries := Queries{}
	for _, b := range blocks {
		if b.kind != queryBlock {
			continue
		}
		sql, err := expandFragments(b.name, b.body, fragments, texts)
		if err != nil {
			return nil, err
		}
		queries[b.name] = schema.Render(sql)
	}
	return queries, nil
}

// fragmentColumns splits a fragment's comma-separated list, leaving out
// comment lines.
func fragmentColumns(body string) []string {
	var list strings.Builder
	for line := range strings.Lines(body) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			list.WriteString(line)
		}
	}
	var cols []string
	for _, c := range strings.Split(list.String(), ",") {
		if c = strings.TrimSpace(c); c != "" {
			cols = append(cols, c)
		}
	}
	return cols
}

type block struct {
	name string
	body string
	kind blockKind
}

type blockKind int

const (
	queryBlock    blockKind = iota // -- name:
	fragmentBlock                  // -- fragment:
	textBlock                      // -- block:
)

// blockHeads are the lines that start a block, with the kind each starts.
var blockHeads = []struct {
	prefix string
	kind   blockKind
}{{"-- name:", queryBlock}, {"-- fragment:", fragmentBlock}, {"-- block:", textBlock}}

func splitBlocks(src string) ([]block, error) {
	var blocks []block
	seen := map[string]bool{}
	var cur *block
	var body strings.Builder
	flush := func() error {
		if cur == nil {
			return nil
		}
		cur.body = strings.TrimSpace(body.String())
		body.Reset()
		if cur.body == "" {
			return fmt.Errorf("dbsql: %q is empty", cur.name)
		}
		if seen[cur.name] {
			return fmt.Errorf("dbsql: %q is defined twice", cur.name)
		}
		seen[cur.name] = true
		blocks = append(blocks, *cur)
		return nil
	}
	scanner := bufio.NewScanner(strings.NewReader(src))
	for scanner.Scan() {
		line := scanner.Text()
		trimmed := strings.TrimSpace(line)
		head := false
		for _, h := range blockHeads {
			rest, ok := strings.CutPrefix(trimmed, h.prefix)
			if !ok {
				continue
			}
			if err := flush(); err != nil {
				return nil, err
			}
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				return nil, fmt.Errorf("dbsql: a name line has no name: %q", line)
			}
			cur, head = &block{name: fields[0], kind: h.kind}, true
			break
		}
		if head {
			continue
		}
		if cur != nil {
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
	return blocks, nil
}

// fragmentMarker matches /*name*/ and /*name alias*/.
var fragmentMarker = regexp.MustCompile(`/\*([a-z_]+)(?: ([a-z_]+))?\*/`)

// expandFragments replaces the fragment and block markers of query's sql
// (texts nil: no block may be used).
func expandFragments(query, sql string, fragments map[string][]string, texts map[string]string) (string, error) {
	var missing error
	out := fragmentMarker.ReplaceAllStringFunc(sql, func(marker string) string {
		m := fragmentMarker.FindStringSubmatch(marker)
		if text, ok := texts[m[1]]; ok {
			if m[2] != "" && missing == nil {
				missing = fmt.Errorf("dbsql: query %q qualifies block %s with an alias", query, marker)
			}
			return text
		}
		cols, ok := fragments[m[1]]
		if !ok {
			if m[1] != "schema" && m[2] == "" && missing == nil {
				missing = fmt.Errorf("dbsql: query %q uses undefined fragment %s", query, marker)
			}
			return marker
		}
		if m[2] == "" {
			return strings.Join(cols, ", ")
		}
		qualified := make([]string, len(cols))
		for i, c := range cols {
			qualified[i] = m[2] + "." + c
		}
		return strings.Join(qualified, ", ")
	})
	return out, missing
}
