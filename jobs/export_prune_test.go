package jobs

// PruneQueryForTest returns one of the pruner's statements, for plan checks.
func (p *Pruner) PruneQueryForTest(name string) string {
	return map[string]string{"PruneFinished": p.sql.prune, "CountFinished": p.sql.countFinished, "OldestFinished": p.sql.oldestFinished}[name]
}
