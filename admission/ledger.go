package admission

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/llmq/llmq/internal/dbsql"
)

// BatchUsage is what the provider reported for one request it served in a
// batch (package providerbatch), for the usage ledger.
type BatchUsage struct {
	Tenant       string
	InputTokens  int64
	OutputTokens int64
}

// BatchLedger adds the usage of provider batch results to the usage
// ledger (Postgres.Usage), at the pool's batch prices (Pool.BatchInputPrice
// and BatchOutputPrice; zero: half the synchronous prices). The results
// pass no limiter: a batch is admitted by the provider's batch limits,
// not by RPM and TPM. The zero value is not usable; see NewBatchLedger.
type BatchLedger struct {
	sql statements
}

// NewBatchLedger returns a ledger writer for the tables in schema
// (default "llmq").
func NewBatchLedger(schema string) (*BatchLedger, error) {
	s, err := dbsql.NewSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	l := &BatchLedger{}
	if _, err := l.sql.load(s); err != nil {
		return nil, fmt.Errorf("admission: %w", err)
	}
	return l, nil
}

// Record adds usage, one element a result, to pool's ledger rows for
// today (UTC), on db: pass the transaction that records the results, so
// that a result is in the ledger exactly when it is applied. Elements
// without a tenant are left out, as Release leaves out permits without
// one.
func (l *BatchLedger) Record(ctx context.Context, db DBTX, pool string, usage []BatchUsage) error {
	if len(usage) == 0 {
		return nil
	}
	tenants := make([]string, len(usage))
	in, out := make([]int64, len(usage)), make([]int64, len(usage))
	for i, u := range usage {
		tenants[i], in[i], out[i] = u.Tenant, u.InputTokens, u.OutputTokens
	}
	// Any shard will do: the rows of a key are summed when read; a random
	// one spreads a busy tenant's row locks as the limiter's releases do.
	shard := int16(rand.IntN(ledgerShards)) //nolint:gosec // a spread, not a secret
	if _, err := db.Exec(ctx, l.sql.recordBatchUsage, pool, tenants, in, out, shard); err != nil {
		return fmt.Errorf("admission: recording the batch usage of pool %q: %w", pool, err)
	}
	return nil
}
