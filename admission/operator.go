package admission

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Operator reads: what cmd/llmq lists. None of them is on a caller's path.

// Pools returns every pool's limits and current state, by name.
func (l *Postgres) Pools(ctx context.Context) ([]PoolState, error) {
	done, err := l.slot(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	rows, err := l.db.Query(ctx, l.sql.selectPools)
	if err != nil {
		return nil, fmt.Errorf("admission: listing pools: %w", err)
	}
	pools, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PoolState, error) {
		var p poolScan
		err := row.Scan(p.namedDest()...)
		return p.state(), err
	})
	if err != nil {
		return nil, fmt.Errorf("admission: listing pools: %w", err)
	}
	return pools, nil
}

// TenantQuotas returns every tenant's own quota (set by SetTenantQuota).
// Tenants without one are left out: the host's QuotaConfig.Default applies
// to them.
func (q *Quotas) TenantQuotas(ctx context.Context, db DBTX) (map[string]TenantQuota, error) {
	return q.selectQuotas(ctx, db, nil)
}

// TenantQuotaOf returns tenant's own quota, and false when it has none (the
// host's QuotaConfig.Default applies).
func (q *Quotas) TenantQuotaOf(ctx context.Context, db DBTX, tenant string) (TenantQuota, bool, error) {
	if err := validateTenant(tenant); err != nil {
		return TenantQuota{}, false, err
	}
	all, err := q.selectQuotas(ctx, db, &tenant)
	if err != nil {
		return TenantQuota{}, false, err
	}
	quota, ok := all[tenant]
	return quota, ok, nil
}

// DeleteTenantQuota removes tenant's own quota: the default applies to it
// from its next acceptance.
func (q *Quotas) DeleteTenantQuota(ctx context.Context, db DBTX, tenant string) error {
	if err := validateTenant(tenant); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, q.sql.deleteTenantQuota, tenant); err != nil {
		return fmt.Errorf("admission: deleting the quota of tenant %q: %w", tenant, err)
	}
	return nil
}

func (q *Quotas) selectQuotas(ctx context.Context, db DBTX, tenant *string) (map[string]TenantQuota, error) {
	rows, err := db.Query(ctx, q.sql.selectTenantQuotas, tenant)
	if err != nil {
		return nil, fmt.Errorf("admission: reading tenant quotas: %w", err)
	}
	defer rows.Close()
	out := map[string]TenantQuota{}
	for rows.Next() {
		var s quotaScan
		if err := rows.Scan(s.dest()...); err != nil {
			return nil, fmt.Errorf("admission: reading tenant quotas: %w", err)
		}
		out[s.tenant] = s.quota()
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("admission: reading tenant quotas: %w", err)
	}
	return out, nil
}
