package main

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// walMeter measures what a bench phase wrote to the write-ahead log, per
// job: work per job, not time, so the figure hardly depends on the
// machine's load.
//
// The total is the distance the WAL insert position moved during the
// phase. It counts everything the server wrote meanwhile, other databases'
// work included, so on a shared server it is an upper bound. When the
// pg_walinspect extension can be used (PostgreSQL 15 ships it), the
// records of the phase that touch the bench schema's own relations are
// read back too: their bytes (full-page images included), heap rows
// inserted, updated (and how many of those were heap-only) and locked,
// and index entries. Those figures are this schema's alone, however busy
// the server; commit records carry no relation and are left out of them.
type walMeter struct {
	pool   *pgxpool.Pool
	schema string
	// inspect is the schema holding pg_walinspect's functions, "" when they
	// cannot be used.
	inspect string
	// perRelation adds a line per relation to each phase's figures
	// (-wal-detail).
	perRelation bool
	// slot holds the session of a temporary replication slot that keeps
	// the server from recycling the WAL the meter still has to read (a
	// busy server's checkpoints otherwise remove it during a long phase).
	// The slot goes with the session, however the bench ends. The session
	// is its own connection, not one of the bench pool's.
	slot *pgx.Conn
}

// newWALMeter prepares a meter. When records is set, pg_walinspect is
// created in the bench's throwaway schema (dropped with it) unless the
// database already has it; without it, or without records, only totals are
// printed.
func newWALMeter(ctx context.Context, pool *pgxpool.Pool, schema string, records bool, stderr io.Writer) *walMeter {
	m := &walMeter{pool: pool, schema: schema}
	if !records {
		return m
	}
	if err := m.findInspect(ctx); err != nil {
		fmt.Fprintf(stderr, "llmq bench: pg_walinspect unavailable (%v); printing WAL totals only\n", err)
		return m
	}
	if err := m.holdWAL(ctx); err != nil {
		fmt.Fprintf(stderr, "llmq bench: no temporary replication slot (%v): a checkpoint may recycle WAL before it is read\n", err)
	}
	return m
}

// holdWAL creates a temporary physical replication slot reserving WAL from
// now on, on a connection of its own.
func (m *walMeter) holdWAL(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, m.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true, true)", m.schema)
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return err
	}
	m.slot = conn
	return nil
}

// close drops the slot, closing its session (a temporary slot cannot
// outlive it).
func (m *walMeter) close(ctx context.Context) {
	if m == nil || m.slot == nil {
		return
	}
	_ = m.slot.Close(context.WithoutCancel(ctx))
	m.slot = nil
}

// findInspect finds pg_walinspect, or creates it in the bench's schema.
// An extension this role may not execute counts as unavailable.
func (m *walMeter) findInspect(ctx context.Context) error {
	if m.lookupInspect(ctx) == nil {
		return m.checkInspect(ctx)
	}
	if _, err := m.pool.Exec(ctx, "CREATE EXTENSION pg_walinspect SCHEMA "+pgx.Identifier{m.schema}.Sanitize()); err != nil {
		// Another bench may have created it meanwhile (two create it at
		// once: one of them fails).
		if m.lookupInspect(ctx) == nil {
			return m.checkInspect(ctx)
		}
		return err
	}
	m.inspect = m.schema
	return nil
}

// lookupInspect sets m.inspect to the schema of an installed pg_walinspect.
func (m *walMeter) lookupInspect(ctx context.Context) error {
	err := m.pool.QueryRow(ctx, `SELECT n.nspname FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
		WHERE e.extname = 'pg_walinspect'`).Scan(&m.inspect)
	if err != nil {
		m.inspect = ""
	}
	return err
}

// checkInspect refuses an installed pg_walinspect this role may not call
// (its functions are for superusers and pg_read_server_files by default).
func (m *walMeter) checkInspect(ctx context.Context) error {
	var allowed bool
	fn := pgx.Identifier{m.inspect}.Sanitize() + ".pg_get_wal_records_info(pg_lsn, pg_lsn)"
	if err := m.pool.QueryRow(ctx, "SELECT has_function_privilege($1, 'EXECUTE')", fn).Scan(&allowed); err != nil {
		m.inspect = ""
		return err
	}
	if !allowed {
		m.inspect = ""
		return fmt.Errorf("this role may not execute %s", fn)
	}
	return nil
}

// walMark is the WAL insert position when a phase began.
type walMark string

func (m *walMeter) mark(ctx context.Context) (walMark, error) {
	var lsn string
	err := m.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
	return walMark(lsn), err
}

// walPhase is what one phase wrote, in total and (when inspected) to the
// bench schema's relations.
type walPhase struct {
	total     int64
	inspected bool
	records   int64 // WAL records touching the schema
	bytes     int64 // their length, full-page images included
	fpiBytes  int64
	inserts   int64 // heap rows inserted
	updates   int64 // heap rows updated, HOT or not
	hot       int64 // heap-only updates
	locks     int64 // heap row locks (SELECT FOR UPDATE)
	deletes   int64
	indexes   int64 // index entries inserted (btree leaf inserts)

	relations []walRelation // -wal-detail
}

func (m *walMeter) inspectPhase(ctx context.Context, p *walPhase, from walMark, to string) error {
	fn := pgx.Identifier{m.inspect}.Sanitize()
	err := m.pool.QueryRow(ctx, fmt.Sprintf(walInspectSQL, fn, "", ""), string(from), to, m.schema).Scan(
		&p.records, &p.bytes, &p.fpiBytes, &p.inserts, &p.updates, &p.hot, &p.locks, &p.deletes, &p.indexes)
	if err == nil && m.perRelation {
		p.relations, err = m.relations(ctx, fmt.Sprintf(walInspectSQL, fn, "rel.relname,", "GROUP BY rel.relname ORDER BY 3 DESC"), from, to)
	}
	return err
}

// walRelation is one relation's share of a phase.
type walRelation struct {
	name string
	walPhase
}

func (m *walMeter) relations(ctx context.Context, sql string, from walMark, to string) ([]walRelation, error) {
	rows, err := m.pool.Query(ctx, sql, string(from), to, m.schema)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (walRelation, error) {
		r := walRelation{walPhase: walPhase{inspected: true}}
		err := row.Scan(&r.name, &r.records, &r.bytes, &r.fpiBytes, &r.inserts, &r.updates, &r.hot, &r.locks, &r.deletes, &r.indexes)
		r.total = r.bytes
		return r, err
	})
}

// The records of [$1, $2) that touch a relation of schema $3: tables,
// indexes and TOAST. A record names its blocks as "rel spc/db/filenode".
// Records come in kinds per resource manager: Heap INSERT, UPDATE,
// HOT_UPDATE, LOCK, DELETE (each possibly "+INIT" on a fresh page), Heap2
// MULTI_INSERT, Btree INSERT_LEAF (one index entry) and others (splits,
// vacuum, pruning) counted only in bytes.
const walInspectSQL = `
WITH rel AS (
    SELECT pg_relation_filenode(c.oid) AS node, c.relname
    FROM pg_class AS c
    WHERE c.relnamespace = $3::regnamespace
        OR c.oid IN (SELECT t.reltoastrelid FROM pg_class AS t WHERE t.relnamespace = $3::regnamespace)
        OR c.oid IN (SELECT i.indexrelid FROM pg_index AS i JOIN pg_class AS t ON t.oid = i.indrelid
                     WHERE t.oid IN (SELECT reltoastrelid FROM pg_class WHERE relnamespace = $3::regnamespace))
),
rec AS MATERIALIZED (
    SELECT w.resource_manager AS rm, split_part(w.record_type, '+', 1) AS kind,
        w.record_length, w.fpi_length,
        (regexp_match(w.block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid AS node
    FROM %s.pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn) AS w
    WHERE w.block_ref <> ''
)
SELECT %s count(*), coalesce(sum(record_length), 0)::bigint, coalesce(sum(fpi_length), 0)::bigint,
    count(*) FILTER (WHERE rm = 'Heap' AND kind = 'INSERT'),
    count(*) FILTER (WHERE rm = 'Heap' AND kind IN ('UPDATE', 'HOT_UPDATE')),
    count(*) FILTER (WHERE rm = 'Heap' AND kind = 'HOT_UPDATE'),
    count(*) FILTER (WHERE rm = 'Heap' AND kind = 'LOCK'),
    count(*) FILTER (WHERE rm = 'Heap' AND kind = 'DELETE'),
    count(*) FILTER (WHERE rm = 'Btree' AND kind = 'INSERT_LEAF')
FROM rec
JOIN rel USING (node)
%s`

// measure reports what was written since from. The inspected figures are
// read up to the WAL flush position, which covers every commit of the
// phase (commits wait for their flush); if the server has already recycled
// the WAL of the phase, only the total is given.
func (m *walMeter) measure(ctx context.Context, from walMark, stderr io.Writer) (walPhase, error) {
	var p walPhase
	var flushed string
	err := m.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - $1::pg_lsn, pg_current_wal_flush_lsn()::text",
		string(from)).Scan(&p.total, &flushed)
	if err != nil || m.inspect == "" {
		return p, err
	}
	err = m.inspectPhase(ctx, &p, from, flushed)
	if err != nil && m.inspect != m.schema {
		// Another bench's schema held the extension and was dropped
		// meanwhile: take it into this one and read again.
		if err = m.findInspect(ctx); err == nil {
			err = m.inspectPhase(ctx, &p, from, flushed)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "llmq bench: reading the WAL back: %v; printing the total only\n", err)
		return walPhase{total: p.total}, nil
	}
	p.inspected = true
	return p, nil
}

// lines gives the phase's line and, with -wal-detail, a line per relation.
func (p walPhase) lines(phase string, jobs int) []walLine {
	lines := []walLine{p.line(phase, "", jobs)}
	for _, r := range p.relations {
		lines = append(lines, r.line(phase, r.name, jobs))
	}
	return lines
}

func (p walPhase) line(phase, relation string, jobs int) walLine {
	n := float64(max(jobs, 1))
	l := walLine{Phase: phase, Relation: relation, Jobs: jobs, BytesPerJob: float64(p.total) / n}
	if p.inspected {
		hotPct := 0.0
		if p.updates > 0 {
			hotPct = 100 * float64(p.hot) / float64(p.updates)
		}
		l.walRecordsPerJob = &walRecordsPerJob{
			SchemaBytes: float64(p.bytes) / n, Records: float64(p.records) / n, FPIBytes: float64(p.fpiBytes) / n,
			HeapInserts: float64(p.inserts) / n, Updates: float64(p.updates) / n, HOTPercent: hotPct,
			Locks: float64(p.locks) / n, Deletes: float64(p.deletes) / n, IndexEntries: float64(p.indexes) / n,
		}
	}
	return l
}

// phase measures the phase run by fn and reports its lines.
func (m *walMeter) phase(ctx context.Context, report *benchReport, stderr io.Writer, name string, jobs int, fn func() error) error {
	from, err := m.mark(ctx)
	if err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	p, err := m.measure(ctx, from, stderr)
	if err != nil {
		return err
	}
	report.wal(p.lines(name, jobs)...)
	return nil
}
