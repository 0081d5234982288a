package console

// QueryForTest returns the rendered statement name of a handler built by
// New, for the plan tests.
func QueryForTest(h any, name string) string { return h.(*Handler).q.Must(name) }

// QueryNamesForTest lists the statements of queries.sql.
func QueryNamesForTest(h any) []string {
	var names []string
	for name := range h.(*Handler).q {
		names = append(names, name)
	}
	return names
}
