package console

import "github.com/llmq/llmq/internal/dbsql"

// QueryForTest returns the rendered statement name of a handler built by
// New, for the plan tests.
func QueryForTest(h any, name string) string {
	for _, s := range statementsForTest(h).Specs {
		if s.Name() == name {
			return s.SQL()
		}
	}
	panic("console: no statement named " + name)
}

func handler(h any) *Handler {
	hh, ok := h.(*Handler)
	if !ok {
		panic("console: not a console handler")
	}
	return hh
}

// statementsForTest loads the statements again, for the handler's schema,
// to look them up by name.
func statementsForTest(h any) dbsql.Set {
	schema, err := dbsql.NewSchema(handler(h).cfg.Schema)
	if err != nil {
		panic(err)
	}
	var q statements
	set, err := q.load(schema)
	if err != nil {
		panic(err)
	}
	return set
}

// QueryNamesForTest lists the statements of queries.sql.
func QueryNamesForTest(h any) []string {
	var names []string
	for _, s := range statementsForTest(h).Specs {
		names = append(names, s.Name())
	}
	return names
}
