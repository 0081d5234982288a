package console

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/jobs"
)

// jobSummary is a job as listings show it.
type jobSummary struct {
	ID          uuid.UUID
	Tenant      string
	Kind        string
	Queue       string
	Priority    int
	State       jobs.State
	Attempt     int
	MaxAttempts int
	CreatedAt   time.Time
	FinishedAt  time.Time
	ErrorClass  string
	LastError   string
	ReplayOf    uuid.UUID
	// Replayed: a replay of this job exists (markReplayed).
	Replayed bool
}

func scanSummary(row pgx.CollectableRow) (jobSummary, error) {
	var r summaryRow
	err := row.Scan(r.dest()...)
	s := r.s
	s.Priority, s.State = int(r.priority), jobs.State(r.state)
	s.FinishedAt, s.ErrorClass, s.LastError = dbsql.Deref(r.finished), dbsql.Deref(r.errClass), truncate(1000, dbsql.Deref(r.lastError))
	if r.replayOf.Valid {
		s.ReplayOf = r.replayOf.Bytes
	}
	return s, err
}

func (h *Handler) summaries(ctx context.Context, op, query string, args ...any) ([]jobSummary, error) {
	rows, err := h.cfg.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("console: %s: %w", op, err)
	}
	out, err := pgx.CollectRows(rows, scanSummary)
	if err != nil {
		return nil, fmt.Errorf("console: %s: %w", op, err)
	}
	return out, nil
}

// markReplayed sets Replayed on the listed jobs a replay points to.
func (h *Handler) markReplayed(ctx context.Context, list []jobSummary) error {
	if len(list) == 0 {
		return nil
	}
	ids := make([]string, len(list))
	for i, j := range list {
		ids[i] = j.ID.String()
	}
	rows, err := h.cfg.DB.Query(ctx, h.sql.replayedOf, ids, h.cfg.Tenant)
	if err != nil {
		return fmt.Errorf("console: finding replays: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return fmt.Errorf("console: finding replays: %w", err)
	}
	for i := range list {
		list[i].Replayed = slices.Contains(found, list[i].ID)
	}
	return nil
}

// terminalCount counts the jobs in a terminal state for the dead-letter
// page's tabs: up to Config.CountCap of every tenant's, or the console's
// tenant's among the latest Config.ScanLimit (a lower bound, "N+", when
// the window was full).
func (h *Handler) terminalCount(ctx context.Context, state string) (count, error) {
	limit := h.cfg.CountCap
	if h.cfg.Tenant != "" {
		limit = h.cfg.ScanLimit
	}
	var n, read int64
	if err := h.cfg.DB.QueryRow(ctx, h.sql.terminalCount, state, h.cfg.Tenant, limit).Scan(&n, &read); err != nil {
		return count{}, fmt.Errorf("console: counting %s: %w", state, err)
	}
	if h.cfg.Tenant == "" {
		return count{N: n, Cap: int64(limit)}, nil
	}
	return count{N: n, More: read >= int64(limit)}, nil
}

// queueRow is one queue's live work.
type queueRow struct {
	Queue                        string
	Runnable, Scheduled, Running count
	OldestRunnable               time.Time
	// Partial: the walk over the live work's (tenant, queue, priority)
	// prefixes stopped at Config.CountCap prefixes, so the counts are lower
	// bounds and the oldest runnable job is at least as old as shown.
	Partial bool
}

// queueNames returns the queues to show: those that have had work (the
// scoped tenant's only, when scoped) and Config.Queues.
func (h *Handler) queueNames(ctx context.Context) ([]string, error) {
	query, args := h.sql.queues, []any{}
	if h.cfg.Tenant != "" {
		query, args = h.sql.tenantQueues, []any{h.cfg.Tenant}
	}
	rows, err := h.cfg.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("console: listing queues: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("console: listing queues: %w", err)
	}
	seen := map[string]bool{}
	for _, n := range names {
		seen[n] = true
	}
	for _, q := range h.cfg.Queues {
		if !seen[q] {
			names = append(names, q)
		}
	}
	return names, nil
}

func (h *Handler) queueCounts(ctx context.Context, queues []string) ([]queueRow, error) {
	capN := int64(h.cfg.CountCap)
	query, args := h.sql.queueCounts, []any{queues, h.cfg.CountCap}
	if h.cfg.Tenant != "" {
		query, args = h.sql.queueCountsTenant, append(args, h.cfg.Tenant)
	}
	return rangeScansOnly(ctx, h.cfg.DB, "counting queues", query, args, func(row pgx.CollectableRow) (queueRow, error) {
		r := queueCountRow{q: queueRow{Runnable: count{Cap: capN}, Scheduled: count{Cap: capN}, Running: count{Cap: capN}}}
		err := row.Scan(r.dest()...)
		r.q.OldestRunnable = dbsql.Deref(r.oldest)
		r.q.Runnable.More, r.q.Scheduled.More, r.q.Running.More = r.q.Partial, r.q.Partial, r.q.Partial
		return r.q, err
	})
}

// rangeScansOnlySQL is what rangeScansOnly sets for its statement.
const rangeScansOnlySQL = "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"

// rangeScansOnly runs a counting statement (QueueCounts, TenantRows) in a
// transaction that steers the planner off sequential and bitmap
// scans. Their per-prefix counts are index ranges stopped by a LIMIT, and
// the planner estimates a prefix's rows from averages: for a tenant with
// a large backlog in one prefix it may take a bitmap scan (or a sequential
// one) for cheap, which reads every entry of the prefix, 100,000 scheduled
// jobs to count to the cap. Turned off, they are only used where nothing
// else can serve (the small tables). SET LOCAL ends with the transaction,
// so a pooled connection keeps its settings.
func rangeScansOnly[T any](ctx context.Context, db DBTX, op, query string, args []any, scan pgx.RowToFunc[T]) ([]T, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("console: %s: %w", op, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, rangeScansOnlySQL); err != nil {
		return nil, fmt.Errorf("console: %s: %w", op, err)
	}
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("console: %s: %w", op, err)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, fmt.Errorf("console: %s: %w", op, err)
	}
	return out, nil
}

// minuteCounts is one minute of the finished-jobs chart.
type minuteCounts struct {
	Minute                      time.Time
	Succeeded, Failed, Reviewed int64
	// The counts that stopped at the chart's cap: lower bounds.
	SucceededCapped, FailedCapped, ReviewedCapped bool
}

// Capped reports whether any of the minute's counts is a lower bound.
func (m minuteCounts) Capped() bool { return m.SucceededCapped || m.FailedCapped || m.ReviewedCapped }

const chartMinutes = 60

// DefaultChartCap bounds each (minute, state) count of the overview's
// chart: a minute's count that reaches it is shown as "5,000+". Each
// refresh of the overview reads at most 60 × 3 × the cap index entries
// (900,000 at 5,000 per minute per state, index-only), so a busier
// system sees flat-topped bars marked as lower bounds rather than paying
// more per refresh.
const DefaultChartCap = 5000

// tenantChartJobs bounds the jobs a tenant-scoped chart reads.
const tenantChartJobs = 20_000

func (h *Handler) finishedPerMinute(ctx context.Context, now time.Time) ([]minuteCounts, error) {
	query, args := h.sql.finishedPerMinute, []any{chartMinutes, h.chartCap}
	if h.cfg.Tenant != "" {
		// Jobs accepted up to an hour before the chart's window.
		since := uuidAt(now.Add(-2 * chartMinutes * time.Minute))
		query, args = h.sql.finishedPerMinuteTenant, []any{chartMinutes, h.cfg.Tenant, since, tenantChartJobs}
	}
	rows, err := h.cfg.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("console: finished per minute: %w", err)
	}
	defer rows.Close()
	out := make([]minuteCounts, chartMinutes)
	first := now.UTC().Truncate(time.Minute).Add(-(chartMinutes - 1) * time.Minute)
	for i := range out {
		out[i].Minute = first.Add(time.Duration(i) * time.Minute)
	}
	for rows.Next() {
		var (
			minute time.Time
			state  string
			n      int64
		)
		if err := rows.Scan(&minute, &state, &n); err != nil {
			return nil, fmt.Errorf("console: finished per minute: %w", err)
		}
		i := int(minute.Sub(first) / time.Minute)
		if i < 0 || i >= len(out) {
			continue // the database's clock and ours disagree by a minute
		}
		m := &out[i]
		// Only the operator's statement stops each count at the cap.
		capped := h.cfg.Tenant == "" && n >= int64(h.chartCap)
		switch jobs.State(state) {
		case jobs.StateSucceeded:
			m.Succeeded += n
			m.SucceededCapped = m.SucceededCapped || capped
		case jobs.StateFailedTerminal:
			m.Failed += n
			m.FailedCapped = m.FailedCapped || capped
		case jobs.StateReviewRequired:
			m.Reviewed += n
			m.ReviewedCapped = m.ReviewedCapped || capped
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("console: finished per minute: %w", err)
	}
	return out, nil
}

// outboxLag is the unpublished backlog.
type outboxLag struct {
	Pending count
	Oldest  time.Duration
}

func (h *Handler) outboxLag(ctx context.Context) (outboxLag, error) {
	l := outboxLag{Pending: count{Cap: int64(h.cfg.CountCap)}}
	var oldest float64
	if err := h.cfg.DB.QueryRow(ctx, h.sql.outboxLag, h.cfg.CountCap).Scan(&l.Pending.N, &oldest); err != nil {
		return l, fmt.Errorf("console: outbox lag: %w", err)
	}
	l.Oldest = time.Duration(oldest * float64(time.Second))
	return l, nil
}

// runner is a worker holding live leases.
type runner struct {
	Worker     string
	Leases     int64
	LastClaim  time.Time
	LeaseUntil time.Time
}

// permitHolder is a holder of live admission permits in one pool.
type permitHolder struct {
	Holder, Pool string
	Permits      int64
	ExpiresAt    time.Time
}

// serviceLease is a singleton service's lease (outbox relay, retention).
type serviceLease struct {
	Service    string
	Holder     string
	Epoch      int64
	LeaseUntil time.Time
	AcquiredAt time.Time
	Live       bool
	LastPass   time.Time // retention's last pass; zero for none (and for the relay)
}

func (h *Handler) runners(ctx context.Context) ([]runner, error) {
	rows, err := h.cfg.DB.Query(ctx, h.sql.runners, h.cfg.CountCap)
	if err != nil {
		return nil, fmt.Errorf("console: runners: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (runner, error) {
		var s runnerRow
		err := row.Scan(s.dest()...)
		r := s.r
		r.Worker, r.LastClaim = dbsql.Deref(s.owner), dbsql.Deref(s.last)
		return r, err
	})
}

func (h *Handler) permitHolders(ctx context.Context) ([]permitHolder, error) {
	rows, err := h.cfg.DB.Query(ctx, h.sql.permitHolders)
	if err != nil {
		return nil, fmt.Errorf("console: permit holders: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (permitHolder, error) {
		var p permitHolder
		err := row.Scan(permitHolderDest(&p)...)
		return p, err
	})
}

func (h *Handler) serviceLeases(ctx context.Context) ([]serviceLease, error) {
	rows, err := h.cfg.DB.Query(ctx, h.sql.serviceLeases)
	if err != nil {
		return nil, fmt.Errorf("console: service leases: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (serviceLease, error) {
		var r serviceLeaseRow
		err := row.Scan(r.dest()...)
		s := r.s
		s.Holder, s.Epoch, s.LeaseUntil, s.AcquiredAt = dbsql.Deref(r.holder), dbsql.Deref(r.epoch), dbsql.Deref(r.until), dbsql.Deref(r.acquired)
		s.LastPass = dbsql.Deref(r.lastPass)
		return s, err
	})
}

// tenantRow is one (queue, tenant) of the tenants page.
type tenantRow struct {
	Queue, Tenant                string
	Idle                         bool
	Weight, MaxRunning           int
	OwnLimits                    bool
	Runnable, Scheduled, Running count
	OldestRunnable               time.Time
	AcceptedHour, FinishedHour   count
}

// Backlog is the row's waiting work, runnable and scheduled.
func (t tenantRow) Backlog() int64 { return t.Runnable.N + t.Scheduled.N }

// Active reports whether the row holds work: waiting or running jobs.
func (t tenantRow) Active() bool { return t.Backlog() > 0 || t.Running.N > 0 }

// Status is what the row's counts say: running, backlog (runnable jobs
// waiting), scheduled (only jobs due later) or idle.
func (t tenantRow) Status() string {
	switch {
	case t.Running.N > 0:
		return "running"
	case t.Runnable.N > 0:
		return "backlog"
	case t.Scheduled.N > 0:
		return "scheduled"
	}
	return "idle"
}

// finishedProbeCap bounds the jobs probed for the tenants page's finished
// count.
const finishedProbeCap = 1000

func (h *Handler) tenantRows(ctx context.Context, tenant, pattern, afterQueue, afterTenant string, limit int) ([]tenantRow, error) {
	capN := int64(h.cfg.CountCap)
	since := uuidAt(time.Now().Add(-time.Hour))
	args := []any{tenant, afterQueue, afterTenant, limit, h.cfg.CountCap, since, finishedProbeCap, pattern, h.cfg.ScanLimit}
	return rangeScansOnly(ctx, h.cfg.DB, "tenants", h.sql.tenantRows, args, func(row pgx.CollectableRow) (tenantRow, error) {
		r := tenantRowScan{t: tenantRow{Runnable: count{Cap: capN}, Scheduled: count{Cap: capN}, Running: count{Cap: capN},
			AcceptedHour: count{Cap: capN}, FinishedHour: count{Cap: finishedProbeCap}}}
		err := row.Scan(r.dest()...)
		r.t.OldestRunnable = dbsql.Deref(r.oldest)
		return r.t, err
	})
}

// tenantWindowEnd returns the last (queue, tenant) of TenantRows' scan
// window, or false when the window reached the end.
func (h *Handler) tenantWindowEnd(ctx context.Context, tenant, afterQueue, afterTenant string) (string, string, bool, error) {
	var queue, name string
	err := h.cfg.DB.QueryRow(ctx, h.sql.tenantWindowEnd, tenant, afterQueue, afterTenant, h.cfg.ScanLimit).Scan(&queue, &name)
	if isNoRows(err) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("console: tenants: %w", err)
	}
	return queue, name, true, nil
}

// likePattern is an ILIKE pattern matching text anywhere in a value:
// the text's own wildcards (%, _) and the escape character are escaped.
func likePattern(text string) string {
	if text == "" {
		return ""
	}
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(text) + "%"
}

// event is one of a job's outbox events.
type event struct {
	ID          uuid.UUID
	Type, Topic string
	CreatedAt   time.Time
	PublishedAt time.Time
	Attempts    int
	LastError   string
}

// DefaultEventScanLimit bounds the outbox entries read from each end of a
// job's range to find its events; a fiftieth of it bounds the batch rows
// (outbox.Store.WriteBatch, the job store's statements of many events)
// read from each end the same way, each holding up to 10,000 events.
const DefaultEventScanLimit = 25_000

// jobEvents returns a job's events, and whether the outbox range they lie
// in was too large to read whole (its middle was left unread).
func (h *Handler) jobEvents(ctx context.Context, j *jobs.Job) ([]event, bool, error) {
	end := j.FinishedAt
	if end.IsZero() {
		end = time.Now()
	}
	// A minute either side covers clock skew between the hosts that
	// generate event ids and the database's clock.
	from, to := j.CreatedAt.Add(-time.Minute), end.Add(time.Minute)
	rows, err := h.cfg.DB.Query(ctx, h.sql.jobEvents, j.ID, uuidAt(from), uuidAt(to), h.eventScanLimit,
		from, to, max(h.eventScanLimit/50, 1))
	if err != nil {
		return nil, false, fmt.Errorf("console: events of %s: %w", j.ID, err)
	}
	defer rows.Close()
	var (
		out []event
		gap bool
	)
	for rows.Next() {
		var r eventRow
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, false, fmt.Errorf("console: events of %s: %w", j.ID, err)
		}
		gap = r.gap
		if e, ok := r.event(); ok {
			out = append(out, e)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("console: events of %s: %w", j.ID, err)
	}
	return out, gap, nil
}

// usageDay is one tenant's usage on one day.
type usageDay struct {
	Tenant                          string
	Day                             time.Time
	Attempts, Uncertain             int64
	InputTokens, OutputTokens, Cost int64
	BatchCost                       int64 // of Cost: provider batch results
}

// usageTenants is the number of tenants per page of the usage chart.
const usageTenants = 10

// usageByDay reads a page of tenants' usage: those after the tenant named
// after, or the scoped tenant's.
func (h *Handler) usageByDay(ctx context.Context, after string, from, to time.Time) ([]usageDay, error) {
	// Days as pgtype.Date: the same text whether or not pgx knows the
	// parameters' type (a time.Time would be a timestamp without it).
	first, last := pgtype.Date{Time: from, Valid: true}, pgtype.Date{Time: to, Valid: true}
	query, args := h.sql.usageByDay, []any{after, first, last, usageTenants + 1}
	if h.cfg.Tenant != "" {
		query, args = h.sql.usageByDayTenant, []any{h.cfg.Tenant, first, last}
	}
	rows, err := h.cfg.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("console: usage: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (usageDay, error) {
		var u usageDay
		err := row.Scan(usageDest(&u)...)
		return u, err
	})
}

// uuidAt is the smallest UUIDv7 of the millisecond t: ids compare as
// bytes, and a UUIDv7 starts with its big-endian millisecond timestamp,
// so jobs created at or after t have ids at or above it.
func uuidAt(t time.Time) uuid.UUID {
	var u uuid.UUID
	ms := t.UnixMilli()
	if ms < 0 {
		ms = 0
	}
	for i := range 6 {
		u[i] = byte(ms >> (8 * (5 - i)))
	}
	u[6] = 0x70
	u[8] = 0x80
	return u
}

// maxUUID is above every id.
var maxUUID = uuid.UUID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
