package erp

import "github.com/llmq/llmq/internal/dbsql"

// statements is every statement of queries.sql, with the shape the code
// binds and scans; dbsqltest checks it against the schema.
type statements struct {
	createTables, book, receipt, invoices, receiptCount string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL},
		dbsql.Script(&q.createTables, "CreateTables"),
		dbsql.Exec(&q.book, "Book", 7),
		dbsql.Exec(&q.receipt, "Receipt", 4),
		dbsql.Query(&q.invoices, "Invoices", 0, invoiceDest(new(Invoice))...),
		dbsql.Query(&q.receiptCount, "ReceiptCount", 0, new(int64), new(int64)),
	)
}

func invoiceDest(i *Invoice) []any {
	return []any{&i.Tenant, &i.Supplier, &i.InvoiceNumber, &i.Currency, &i.Total, &i.JobID, &i.DeliveryID}
}
