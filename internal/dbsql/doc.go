// Package dbsql is how llmq talks SQL: the DBTX seam every store method
// accepts, validated schema names, and the named-query files each package
// keeps its SQL in.
//
// Every llmq table lives in one Postgres schema chosen by the host (default
// "llmq"). SQL files refer to tables as /*schema*/name; the marker is a
// comment, so the files stay valid SQL for editors and linters, and Render
// turns it into a schema-qualified name once, when a store is built. Because
// schema names are validated against a strict pattern before they are ever
// rendered, no identifier quoting is needed and no user input reaches SQL
// text.
package dbsql
