package admission

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
)

// statements is every statement of queries.sql, quotas.sql and prune.sql,
// with the shape the code binds and scans; dbsqltest checks it against the
// schema. Each constructor (NewPostgres, NewQuotas, NewPruner) loads all of
// them, so a statement missing from the files stops construction.
type statements struct {
	// queries.sql: the limiter.
	cycleSetup, releaseGroup, grantGroup, acquireOne, releaseOne  string
	upsertPool, selectPool, selectPools, reapPermits, setCooldown string
	lowerRemaining, countPermits, selectUsage, recordBatchUsage   string
	// quotas.sql
	upsertTenantQuota, deleteTenantQuota, selectTenantQuotas string
	countPendingSystem, lockTenantQuota, countPendingTenant  string
	// prune.sql
	poolsWithExpiredPermits, countExpiredPermits, reapExpiredBatch string
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL, quotasSQL, pruneSQL},
		// The cycle's statements bind arrays and durations, so their
		// argument types are declared too (see cycle.go).
		dbsql.Discard(&q.cycleSetup, "CycleSetup", 1).Binds(""),
		dbsql.Discard(&q.releaseGroup, "ReleaseGroup", 6).
			Binds("", []pgtype.UUID{}, []int16{}, []int64{}, []int64{}, int16(0)),
		dbsql.Query(&q.grantGroup, "GrantGroup", 7, new(grantScan).dest()...).
			Binds("", []pgtype.UUID{}, []int64{}, []string{}, "", time.Duration(0), false),
		dbsql.Query(&q.acquireOne, "AcquireOne", 6, new(grantScan).acquiredDest()...).
			Binds("", int64(0), pgtype.UUID{}, "", "", time.Duration(0)),
		dbsql.Discard(&q.releaseOne, "ReleaseOne", 5).Binds(pgtype.UUID{}, 0, int64(0), int64(0), int16(0)),
		dbsql.Exec(&q.upsertPool, "UpsertPool", 13),
		dbsql.Query(&q.selectPool, "SelectPool", 1, new(poolScan).dest()...),
		dbsql.Query(&q.selectPools, "SelectPools", 0, new(poolScan).namedDest()...),
		dbsql.Query(&q.reapPermits, "ReapPermits", 1, new(int64)),
		dbsql.Exec(&q.setCooldown, "SetCooldown", 2),
		dbsql.Exec(&q.lowerRemaining, "LowerRemaining", 3),
		dbsql.Query(&q.countPermits, "CountPermits", 1, new(int), new(int)),
		dbsql.Query(&q.selectUsage, "SelectUsage", 3, usageDest(new(Usage))...),
		dbsql.Exec(&q.recordBatchUsage, "RecordBatchUsage", 5).Binds("", []string{}, []int64{}, []int64{}, int16(0)),
		dbsql.Exec(&q.upsertTenantQuota, "UpsertTenantQuota", 5),
		dbsql.Exec(&q.deleteTenantQuota, "DeleteTenantQuota", 1),
		dbsql.Query(&q.selectTenantQuotas, "SelectTenantQuotas", 1, new(quotaScan).dest()...),
		dbsql.Query(&q.countPendingSystem, "CountPendingSystem", 1, new(int64)),
		dbsql.Query(&q.lockTenantQuota, "LockTenantQuota", 2, new(quotaScan).lockDest()...),
		dbsql.Query(&q.countPendingTenant, "CountPendingTenant", 2, new(int64), new(int64), new(int64), new(int64)),
		dbsql.Query(&q.poolsWithExpiredPermits, "PoolsWithExpiredPermits", 0, new(string)),
		dbsql.Query(&q.countExpiredPermits, "CountExpiredPermits", 0, new(int64), new(*time.Time)),
		dbsql.Query(&q.reapExpiredBatch, "ReapExpiredBatch", 2, new(*string), new(int64), new(int64)),
	)
}

// grantScan is a GrantGroup row (or an AcquireOne row) as scanned.
type grantScan struct {
	g        grantRow
	cooldown float64 // seconds
	discard  string
}

func (s *grantScan) dest() []any {
	a := &s.g.after
	return []any{&s.g.acquired, &s.g.expires, &a.RPM, &a.TPM, &a.MaxInFlight, &a.TokenBurst,
		&a.RequestLevel, &a.TokenLevel, &a.InFlight, &s.cooldown, &a.MaxInFlightTokens, &a.InFlightTokens}
}

func (s *grantScan) acquiredDest() []any { return []any{&s.g.acquired, &s.g.expires, &s.discard} }

// poolScan is a SelectPool or SelectPools row as scanned.
type poolScan struct {
	s        PoolState
	cooldown float64 // seconds
}

func (p *poolScan) dest() []any {
	s := &p.s
	return []any{&s.RPM, &s.TPM, &s.MaxInFlight, &s.RequestBurst, &s.TokenBurst, &s.ChargeReserved, &s.RefundUncertain,
		&s.InputPrice, &s.OutputPrice, &s.BatchInputPrice, &s.BatchOutputPrice,
		&s.RequestLevel, &s.TokenLevel, &s.InFlight, &p.cooldown, &s.hasExpired,
		&s.MaxInFlightTokens, &s.InFlightTokens}
}

func (p *poolScan) namedDest() []any { return append([]any{&p.s.Name}, p.dest()...) }

func (p *poolScan) state() PoolState {
	s := p.s
	s.Cooldown = seconds(p.cooldown)
	return s
}

func usageDest(u *Usage) []any {
	return []any{&u.Tenant, &u.Pool, &u.Day, &u.Attempts, &u.UncertainAttempts, &u.InputTokens, &u.OutputTokens, &u.Cost, &u.BatchAttempts, &u.BatchCost}
}

// quotaScan is a tenant's quota row as scanned; NULL limits are unset.
type quotaScan struct {
	tenant                    string
	own                       bool
	jobs, bytes, tokens, cost *int64
}

func (q *quotaScan) dest() []any { return []any{&q.tenant, &q.jobs, &q.bytes, &q.tokens, &q.cost} }

func (q *quotaScan) lockDest() []any { return []any{&q.own, &q.jobs, &q.bytes, &q.tokens, &q.cost} }

func (q *quotaScan) quota() TenantQuota {
	return TenantQuota{MaxPendingJobs: dbsql.Deref(q.jobs), MaxPendingBytes: dbsql.Deref(q.bytes),
		MaxPendingTokens: dbsql.Deref(q.tokens), MaxDailyCost: dbsql.Deref(q.cost)}
}
