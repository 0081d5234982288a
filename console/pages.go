package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/providerbatch"
)

type overviewData struct {
	Queues   []queueRow
	Minutes  []minuteCounts
	Chart    barChart
	Finished struct{ Succeeded, Failed, Reviewed count } // over the hour; More when a minute's count was capped
	Outbox   outboxLag
	Runners  []runner
	Permits  []permitHolder
	Services []serviceLease
	System   bool // the infrastructure panels are shown (not tenant-scoped)
	ChartCap int64
	Health   *healthData
}

func (h *Handler) overview(ctx context.Context, _ *http.Request, v *view) error {
	v.Title = "Overview"
	d := &overviewData{System: h.cfg.Tenant == "", ChartCap: int64(h.chartCap)}
	v.Data = d
	names, err := h.queueNames(ctx)
	if err != nil {
		return err
	}
	if d.Queues, err = h.queueCounts(ctx, names); err != nil {
		return err
	}
	if d.Minutes, err = h.finishedPerMinute(ctx, v.Now); err != nil {
		return err
	}
	for _, m := range d.Minutes {
		addCapped(&d.Finished.Succeeded, m.Succeeded, m.SucceededCapped)
		addCapped(&d.Finished.Failed, m.Failed, m.FailedCapped)
		addCapped(&d.Finished.Reviewed, m.Reviewed, m.ReviewedCapped)
	}
	d.Chart = minuteChart(d.Minutes)
	if d.System {
		if d.Outbox, err = h.outboxLag(ctx); err != nil {
			return err
		}
		if d.Runners, err = h.runners(ctx); err != nil {
			return err
		}
		if d.Permits, err = h.permitHolders(ctx); err != nil {
			return err
		}
		if d.Services, err = h.serviceLeases(ctx); err != nil {
			return err
		}
	}
	return h.health(ctx, d, v.Now)
}

// addCapped adds a minute's count to a total, which is a lower bound once
// any of its minutes is.
func addCapped(total *count, n int64, capped bool) {
	total.N += n
	total.More = total.More || capped
}

type tenantsData struct {
	Rows      []tenantRow
	Tenants   []tenantHour // each tenant of Rows once, with its last hour
	Filter    string
	ShowIdle  bool
	Hidden    int  // idle rows of this page left out
	Window    bool // the page ended at the scan window, not at a full page
	NextQuery template.URL
	// IdleQuery and ActiveQuery show this page with and without idle rows.
	IdleQuery, ActiveQuery template.URL
}

// tenantHour is a tenant's jobs accepted in the last hour, in all its
// queues, and how many of the latest of those finished.
type tenantHour struct {
	Tenant                     string
	AcceptedHour, FinishedHour count
}

// tenantsPage is how many (queue, tenant) rows a tenants page reads.
const tenantsPage = 100

func (h *Handler) tenants(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Tenants"
	q := r.URL.Query()
	d := &tenantsData{Filter: q.Get("tenant")}
	v.Data = d
	// The form sends a hidden 0 before the checkbox's 1: the last wins.
	idle := ""
	if list := q["idle"]; len(list) > 0 {
		idle = list[len(list)-1]
	}
	switch idle {
	case "", "0":
	case "1":
		d.ShowIdle = true
	default:
		return badInput("idle", "use 1 to show idle rows, or leave it out")
	}
	if p := validate.Text(d.Filter, false, jobs.MaxTenantLen); p != "" {
		return badInput("tenant", p)
	}
	// An operator's filter is a case-insensitive substring of the tenant;
	// a tenant's console shows its own rows only.
	exact, pattern := h.cfg.Tenant, likePattern(d.Filter)
	if exact != "" {
		if d.Filter != "" && d.Filter != exact {
			return &httpError{status: http.StatusForbidden, msg: "tenant: this console shows only its own tenant's jobs"}
		}
		pattern = ""
	}
	afterQueue, afterTenant, err := tenantCursor(q)
	if err != nil {
		return err
	}
	query := func(idle bool, extra ...string) template.URL {
		u := url.Values{}
		if d.Filter != "" {
			u.Set("tenant", d.Filter)
		}
		if idle {
			u.Set("idle", "1")
		}
		for i := 0; i+1 < len(extra); i += 2 {
			u.Set(extra[i], extra[i+1])
		}
		return template.URL(u.Encode()) // #nosec G203 -- built by url.Values.Encode
	}
	d.IdleQuery, d.ActiveQuery = query(true), query(false)
	rows, err := h.tenantRows(ctx, exact, pattern, afterQueue, afterTenant, tenantsPage+1)
	if err != nil {
		return err
	}
	if len(rows) > tenantsPage {
		rows = rows[:tenantsPage]
		last := rows[len(rows)-1]
		d.NextQuery = query(d.ShowIdle, "after_queue", last.Queue, "after_tenant", last.Tenant)
	} else if endQueue, endTenant, ok, err := h.tenantWindowEnd(ctx, exact, afterQueue, afterTenant); err != nil {
		return err
	} else if ok {
		d.Window = true
		d.NextQuery = query(d.ShowIdle, "after_queue", endQueue, "after_tenant", endTenant)
	}
	seen := map[string]bool{}
	for _, row := range rows {
		if !seen[row.Tenant] {
			seen[row.Tenant] = true
			d.Tenants = append(d.Tenants, tenantHour{Tenant: row.Tenant, AcceptedHour: row.AcceptedHour, FinishedHour: row.FinishedHour})
		}
		if !d.ShowIdle && !row.Active() {
			d.Hidden++
			continue
		}
		d.Rows = append(d.Rows, row)
	}
	// The largest backlog first, then the most running, then key order.
	slices.SortStableFunc(d.Rows, func(a, b tenantRow) int {
		if c := cmp.Compare(b.Backlog(), a.Backlog()); c != 0 {
			return c
		}
		return cmp.Compare(b.Running.N, a.Running.N)
	})
	slices.SortStableFunc(d.Tenants, func(a, b tenantHour) int { return cmp.Compare(b.AcceptedHour.N, a.AcceptedHour.N) })
	return nil
}

type listData struct {
	Filter     jobFilter
	Jobs       []jobSummary
	NextQuery  template.URL // the next page's query string; "" on the last
	Window     bool         // the page ended at the scan limit, not at a full page
	ScanLimitN int64
	Path       string // the page's path under the base, for its links
	States     []jobs.State
	Queues     []string
}

func (h *Handler) jobList(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Jobs"
	f, err := h.parseFilter(r.URL.Query())
	d := &listData{Filter: f, ScanLimitN: int64(h.cfg.ScanLimit), Path: "jobs", States: jobs.States()}
	v.Data = d
	if err != nil {
		return err
	}
	if d.Queues, err = h.queueNames(ctx); err != nil {
		return err
	}
	return h.listByID(ctx, r, f, f.States, d)
}

// listByID fills d with a page of jobs newest first (by id, so by
// acceptance), filtered by f and states, from the "before" cursor of r;
// extra pairs go into the next page's query.
func (h *Handler) listByID(ctx context.Context, r *http.Request, f jobFilter, states []string, d *listData, extra ...string) error {
	if err := h.listPageByID(ctx, r, f, states, d, extra...); err != nil {
		return err
	}
	return h.markReplayed(ctx, d.Jobs)
}

func (h *Handler) listPageByID(ctx context.Context, r *http.Request, f jobFilter, states []string, d *listData, extra ...string) error {
	before := maxUUID
	var err error
	if s := r.URL.Query().Get("before"); s != "" {
		if before, err = parseID("before", s); err != nil {
			return err
		}
	}
	if !f.To.IsZero() {
		if to := uuidAt(f.To); bytesLess(to, before) {
			before = to
		}
	}
	after := uuid.Nil
	if !f.From.IsZero() {
		after = uuidAt(f.From)
	}
	if states == nil {
		states = []string{}
	}
	var page []jobSummary
	if f.Tenant != "" {
		page, err = h.summaries(ctx, "listing jobs", h.sql.listTenantJobs, states, f.Kind, f.Queue, before, after, h.cfg.ScanLimit, f.Limit+1, f.Tenant)
	} else {
		page, err = h.summaries(ctx, "listing jobs", h.sql.listJobs, states, f.Kind, f.Queue, before, after, h.cfg.ScanLimit, f.Limit+1)
	}
	if err != nil {
		return err
	}
	if len(page) > f.Limit {
		d.Jobs = page[:f.Limit]
		d.NextQuery = f.query(append(extra, "before", page[f.Limit-1].ID.String())...)
		return nil
	}
	d.Jobs = page
	end, ok, err := h.scanEnd(ctx, f, before, after)
	if err != nil || !ok {
		return err
	}
	d.Window = true
	d.NextQuery = f.query(append(extra, "before", end.String())...)
	return nil
}

// scanEnd returns the last id of a listing's scan window, or false when
// the window reached the end of the range.
func (h *Handler) scanEnd(ctx context.Context, f jobFilter, before, after uuid.UUID) (uuid.UUID, bool, error) {
	query, args := h.sql.listScanEnd, []any{before, after, h.cfg.ScanLimit}
	if f.Tenant != "" {
		query, args = h.sql.listTenantScanEnd, append(args, f.Tenant)
	}
	var id uuid.UUID
	err := h.cfg.DB.QueryRow(ctx, query, args...).Scan((*[16]byte)(&id))
	if isNoRows(err) {
		return uuid.Nil, false, nil
	}
	if err != nil {
		return uuid.Nil, false, fmt.Errorf("console: listing jobs: %w", err)
	}
	return id, true, nil
}

func bytesLess(a, b uuid.UUID) bool {
	return slices.Compare(a[:], b[:]) < 0
}

type deadData struct {
	listData
	State        string
	ByAcceptance bool // ordered by acceptance (one tenant's), not by finish
	// Tabs are the two states' tabs: their counts and links keeping the
	// page's filters.
	Tabs []deadTab
}

type deadTab struct {
	State, Label string
	Count        count
	Query        template.URL
	On           bool
}

var (
	farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	farPast   = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
)

func (h *Handler) deadList(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Dead letters and review"
	q := r.URL.Query()
	f, err := h.parseFilter(q)
	d := &deadData{listData: listData{Filter: f, ScanLimitN: int64(h.cfg.ScanLimit), Path: "dead"}, State: string(jobs.StateFailedTerminal)}
	v.Data = d
	if err != nil {
		return err
	}
	switch {
	case len(f.States) > 1 || (len(f.States) == 1 && f.States[0] != string(jobs.StateFailedTerminal) && f.States[0] != string(jobs.StateReviewRequired)):
		return badInput("state", "use FAILED_TERMINAL or REVIEW_REQUIRED")
	case len(f.States) == 1:
		d.State = f.States[0]
	}
	d.Filter.States = nil
	for _, t := range []struct{ state, label string }{{string(jobs.StateFailedTerminal), "Dead letters (FAILED_TERMINAL)"}, {string(jobs.StateReviewRequired), "Awaiting review (REVIEW_REQUIRED)"}} {
		n, err := h.terminalCount(ctx, t.state)
		if err != nil {
			return err
		}
		d.Tabs = append(d.Tabs, deadTab{State: t.state, Label: t.label, Count: n, Query: d.Filter.query("state", t.state), On: t.state == d.State})
	}
	if err := h.deadPage(ctx, r, f, d); err != nil {
		return err
	}
	return h.markReplayed(ctx, d.Jobs)
}

func (h *Handler) deadPage(ctx context.Context, r *http.Request, f jobFilter, d *deadData) error {
	q := r.URL.Query()
	var err error
	if f.Tenant != "" {
		// One tenant's: walk its keys newest first (job_keys), not every
		// tenant's finished jobs, whose entries would each cost a heap visit
		// to find the tenant. The order is then by acceptance.
		d.ByAcceptance = true
		f.States = nil
		return h.listByID(ctx, r, f, []string{d.State}, &d.listData, "state", d.State)
	}
	at, before := farFuture, maxUUID
	if s := q.Get("at"); s != "" {
		if at, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return badInput("at", "is not a cursor this page wrote")
		}
		if before, err = parseID("before", q.Get("before")); err != nil {
			return err
		}
	}
	if !f.To.IsZero() && f.To.Before(at) {
		at, before = f.To, uuid.Nil
	}
	from := farPast
	if !f.From.IsZero() {
		from = f.From
	}
	page, err := h.summaries(ctx, "listing "+d.State, h.sql.listFinished, d.State, at, before, h.cfg.ScanLimit, f.Tenant, f.Queue, f.Kind, from, f.Limit+1)
	if err != nil {
		return err
	}
	if len(page) > f.Limit {
		last := page[f.Limit-1]
		d.Jobs = page[:f.Limit]
		d.NextQuery = d.Filter.query("state", d.State, "at", last.FinishedAt.Format(time.RFC3339Nano), "before", last.ID.String())
		return nil
	}
	d.Jobs = page
	var (
		endAt time.Time
		endID uuid.UUID
	)
	err = h.cfg.DB.QueryRow(ctx, h.sql.finishedScanEnd, d.State, at, before, h.cfg.ScanLimit, from).Scan(&endAt, (*[16]byte)(&endID))
	if isNoRows(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("console: listing %s: %w", d.State, err)
	}
	d.Window = true
	d.NextQuery = d.Filter.query("state", d.State, "at", endAt.Format(time.RFC3339Nano), "before", endID.String())
	return nil
}

type jobData struct {
	Job         *jobs.Job
	Attempts    []attemptView
	Steps       []jobs.Step
	Events      []event
	EventsCut   bool // the outbox range was read from both ends only
	Ancestors   []jobSummary
	Children    []jobSummary
	TimelineEnd time.Time
	Replayable  bool
	ResultJSON  string
	PayloadJSON string
	// Source is the job whose result this job reused (Job.ReusedFrom),
	// or nil.
	Source *reuseSource
}

// attemptView is an attempt with its duration, for the timeline.
type attemptView struct {
	jobs.Attempt
	Duration time.Duration
	Live     bool
	Bar      timelineBar
	Source   *reuseSource // a reused attempt's source, or nil
}

func (h *Handler) findJob(ctx context.Context, id uuid.UUID) (*jobs.Job, error) {
	if h.cfg.Tenant != "" {
		return h.store.Get(ctx, h.cfg.DB, h.cfg.Tenant, id)
	}
	return h.store.Lookup(ctx, h.cfg.DB, id)
}

func (h *Handler) jobPage(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Job"
	id, err := parseID("id", r.PathValue("id"))
	if err != nil {
		return err
	}
	job, err := h.findJob(ctx, id)
	if err != nil {
		return err
	}
	d := &jobData{Job: job, ResultJSON: indentJSON(job.Result), PayloadJSON: indentJSON(job.Payload)}
	v.Data = d
	v.Title = "Job " + job.ID.String()
	d.Replayable = consoleReplayable(job.State)
	attempts, err := h.store.Attempts(ctx, h.cfg.DB, job.Tenant, job.ID)
	if err != nil {
		return err
	}
	d.Attempts = timeline(attempts, v.Now)
	if d.Source, err = h.reuseSources(ctx, job, d.Attempts); err != nil {
		return err
	}
	if d.Steps, err = h.store.Steps(ctx, h.cfg.DB, job.Tenant, job.ID); err != nil {
		return err
	}
	for _, a := range d.Attempts {
		if end := a.StartedAt.Add(a.Duration); end.After(d.TimelineEnd) {
			d.TimelineEnd = end
		}
	}
	if d.Events, d.EventsCut, err = h.jobEvents(ctx, job); err != nil {
		return err
	}
	if d.Ancestors, err = h.summaries(ctx, "replay lineage", h.sql.replayAncestors, job.ID, job.Tenant); err != nil {
		return err
	}
	d.Children, err = h.summaries(ctx, "replay lineage", h.sql.replayChildren, job.ID, job.Tenant)
	return err
}

// consoleReplayable reports whether the console offers a replay of a job
// in state s: dead letters and jobs awaiting review, as Config.EnableActions
// says. jobs.Store.Replay also takes CANCELLED jobs; someone cancelled those
// on purpose, so running one again is left to the API.
func consoleReplayable(s jobs.State) bool {
	return s == jobs.StateFailedTerminal || s == jobs.StateReviewRequired
}

func (h *Handler) replay(w http.ResponseWriter, r *http.Request, actor string) error {
	id, err := parseID("id", r.PathValue("id"))
	if err != nil {
		return err
	}
	reason := r.PostFormValue("reason")
	if reason == "" {
		return badInput("reason", "is required: say why the job runs again (it is recorded with the replay)")
	}
	again := r.PostFormValue("again") == "on"
	job, err := h.findJob(r.Context(), id)
	if err != nil {
		return err
	}
	if !consoleReplayable(job.State) {
		return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("this job cannot be replayed here: it is %s; the console replays dead-lettered (FAILED_TERMINAL) and REVIEW_REQUIRED jobs", job.State)}
	}
	res, err := h.store.Replay(r.Context(), h.cfg.DB, jobs.ReplayParams{Tenant: job.Tenant, JobID: id, By: actor, Reason: reason, Again: again})
	if err != nil {
		return err
	}
	flash := "replayed"
	if res.Existing {
		flash = "replayed-before"
	}
	h.cfg.Logger.InfoContext(r.Context(), "console: replay", "actor", actor, "job", id, "tenant", job.Tenant,
		"replay", res.Job.ID, "existing", res.Existing, "again", again, "reason", reason)
	target := h.cfg.BasePath + "/jobs/" + res.Job.ID.String() + "?" + url.Values{"flash": {flash}}.Encode()
	http.Redirect(w, r, target, http.StatusSeeOther)
	return nil
}

type poolsData struct {
	Pools  []admission.PoolState
	Usage  []usageDay
	Chart  barChart
	Legend []legendEntry
	Totals []usageTotal
	System bool
	Days   int
	// Metric is what the chart stacks: "cost", or "tokens" when no pool
	// has prices; ChartMax is its highest day, written out.
	Metric   string
	ChartMax string
	// NextTenants is the last tenant of this page when more follow.
	NextTenants string
	NextQuery   template.URL
	// Candidates is what each route candidate did with the attempts
	// started in the last candidatesWindow, the page's tenant's only on a
	// tenant's console; read on a full load, not on the pools' refreshes.
	Candidates []jobs.CandidateStats
}

// candidatesWindow is how far back the admission page's route candidates
// look.
const candidatesWindow = time.Hour

// cutUsagePage keeps the first usageTenants tenants of rows read with one
// more, and names the last kept tenant when there are more.
func cutUsagePage(rows []usageDay) ([]usageDay, string) {
	seen := 0
	for i, u := range rows {
		if i == 0 || rows[i-1].Tenant != u.Tenant {
			seen++
		}
		if seen > usageTenants {
			return rows[:i], rows[i-1].Tenant
		}
	}
	return rows, ""
}

// usageTotal is one tenant's usage over the chart's days.
type usageTotal struct {
	Tenant                          string
	Attempts, Uncertain             int64
	InputTokens, OutputTokens, Cost int64
	BatchCost                       int64 // of Cost: provider batch results
}

const usageDays = 14

func (h *Handler) poolsPage(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Admission pools"
	d := &poolsData{System: h.cfg.Tenant == "", Days: usageDays}
	v.Data = d
	var err error
	if d.System {
		if d.Pools, err = h.limiter.Pools(ctx); err != nil {
			return err
		}
	}
	to := v.Now.UTC()
	from := to.AddDate(0, 0, -(usageDays - 1))
	after := r.URL.Query().Get("after")
	if p := validate.Text(after, false, jobs.MaxTenantLen); p != "" {
		return badInput("after", p)
	}
	if d.Usage, err = h.usageByDay(ctx, after, from, to); err != nil {
		return err
	}
	if d.Usage, d.NextTenants = cutUsagePage(d.Usage); d.NextTenants != "" {
		d.NextQuery = template.URL(url.Values{"after": {d.NextTenants}}.Encode()) // #nosec G203 -- url.Values.Encode escapes
	}
	d.Totals = usageTotals(d.Usage)
	var cost int64
	for _, t := range d.Totals {
		cost += t.Cost
	}
	// Without prices the ledger records no cost: chart the tokens instead.
	d.Metric = "cost"
	value, format := func(u usageDay) int64 { return u.Cost }, func(v int64) string { return formatMicro(v) + " (price currency)" }
	if cost == 0 {
		d.Metric = "tokens"
		value, format = func(u usageDay) int64 { return u.InputTokens + u.OutputTokens }, formatCount
	}
	d.Chart, d.Legend = usageChart(d.Usage, from, usageDays, value, format)
	d.ChartMax = format(d.Chart.Max)
	// The store reads the attempts sequentially (jobs/candidates.sql):
	// once per full load, never for the live part's refreshes, which
	// render only the pools.
	if r.URL.Query().Get("fragment") == "" {
		d.Candidates, err = h.store.CandidateStats(ctx, h.cfg.DB, jobs.CandidateStatsParams{
			Since: v.Now.Add(-candidatesWindow), Tenant: h.cfg.Tenant})
	}
	return err
}

func usageTotals(days []usageDay) []usageTotal {
	var out []usageTotal
	for _, u := range days {
		if len(out) == 0 || out[len(out)-1].Tenant != u.Tenant {
			out = append(out, usageTotal{Tenant: u.Tenant})
		}
		t := &out[len(out)-1]
		t.Attempts += u.Attempts
		t.Uncertain += u.Uncertain
		t.InputTokens += u.InputTokens
		t.OutputTokens += u.OutputTokens
		t.Cost += u.Cost
		t.BatchCost += u.BatchCost
	}
	return out
}

func (h *Handler) setPool(w http.ResponseWriter, r *http.Request, actor string) error {
	if h.cfg.Tenant != "" {
		return &httpError{status: http.StatusForbidden, msg: "pools are shared by every tenant: a tenant's console cannot change them"}
	}
	name := r.PathValue("name")
	if !routableName(name) {
		return badInput("pool", fmt.Sprintf("%q cannot be a link's path segment, so the console does not change that pool; use admission.Postgres.SetPool", truncate(60, name)))
	}
	pools, err := h.limiter.Pools(r.Context())
	if err != nil {
		return err
	}
	i := slices.IndexFunc(pools, func(p admission.PoolState) bool { return p.Name == name })
	if i < 0 {
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no pool named %q", truncate(60, name))}
	}
	p, err := poolFromForm(r, pools[i].Pool)
	if err != nil {
		return err
	}
	if err := h.limiter.SetPool(r.Context(), p); err != nil {
		return err
	}
	h.cfg.Logger.InfoContext(r.Context(), "console: pool limits changed", "actor", actor, "pool", name,
		"rpm", p.RPM, "tpm", p.TPM, "max_in_flight", p.MaxInFlight, "max_in_flight_tokens", p.MaxInFlightTokens,
		"request_burst", p.RequestBurst, "token_burst", p.TokenBurst,
		"input_price", p.InputPrice, "output_price", p.OutputPrice,
		"batch_input_price", p.BatchInputPrice, "batch_output_price", p.BatchOutputPrice)
	target := h.cfg.BasePath + "/pools?" + url.Values{"flash": {"pool-updated"}}.Encode()
	http.Redirect(w, r, target, http.StatusSeeOther)
	return nil
}

type intField struct {
	field string
	dst   *int64
}

// poolFromForm reads a pool's limits from the edit form; a field left
// empty keeps the pool's current value.
func poolFromForm(r *http.Request, p admission.Pool) (admission.Pool, error) {
	rpm, inFlight, reqBurst := int64(p.RPM), int64(p.MaxInFlight), int64(p.RequestBurst)
	ints := []intField{
		{"rpm", &rpm}, {"tpm", &p.TPM}, {"max_in_flight", &inFlight}, {"request_burst", &reqBurst},
		{"token_burst", &p.TokenBurst}, {"input_price", &p.InputPrice}, {"output_price", &p.OutputPrice},
		{"max_in_flight_tokens", &p.MaxInFlightTokens},
		{"batch_input_price", &p.BatchInputPrice}, {"batch_output_price", &p.BatchOutputPrice},
	}
	for _, f := range ints {
		s := r.PostFormValue(f.field)
		if s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n > 1<<40 {
			return p, badInput(f.field, fmt.Sprintf("%q is not a whole number from 0 to %d", truncate(20, s), int64(1)<<40))
		}
		*f.dst = n
	}
	if rpm > 1<<31-1 || inFlight > 1<<31-1 || reqBurst > 1<<31-1 {
		return p, badInput("rpm", "rpm, max_in_flight and request_burst must fit in 32 bits")
	}
	p.RPM, p.MaxInFlight, p.RequestBurst = int(rpm), int(inFlight), int(reqBurst)
	for _, f := range []struct {
		field string
		dst   *bool
	}{{"charge_reserved", &p.ChargeReserved}, {"refund_uncertain", &p.RefundUncertain}} {
		if err := formFlag(r, f.field, f.dst); err != nil {
			return p, err
		}
	}
	return p, nil
}

// formFlag reads a checkbox of the edit form. The form sends a hidden
// "off" before the checkbox's "on", so the last value is the box's state;
// a request without the field at all (a partial edit) keeps the current
// value, as for the numbers.
func formFlag(r *http.Request, field string, dst *bool) error {
	values := r.PostForm[field]
	if len(values) == 0 {
		return nil
	}
	switch values[len(values)-1] {
	case "on":
		*dst = true
	case "off":
		*dst = false
	default:
		return badInput(field, "use on or off")
	}
	return nil
}

type batchesData struct {
	Subs   []batchRow
	Pool   string // the pool filter; "" for every pool
	Limit  int
	System bool // the submissions are shown (not tenant-scoped)
	// MoreQuery shows more of the newest submissions, when more exist and
	// the page is not at its largest; AtMost says it is and more exist.
	MoreQuery template.URL
	AtMost    bool
}

// batchRow is a submission as the batches page shows it.
type batchRow struct {
	providerbatch.Submission
	ErrorLine string // the first line of LastError
	Open      bool   // not ended: cancellable
}

// maxBatchesLimit is the largest page the batches page shows, as the
// listings' limit.
const maxBatchesLimit = 500

func (h *Handler) batchesPage(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Provider batches"
	q := r.URL.Query()
	d := &batchesData{Pool: q.Get("pool"), Limit: DefaultPageSize, System: h.cfg.Tenant == ""}
	v.Data = d
	if p := validate.Text(d.Pool, false, admission.MaxPoolLen); p != "" {
		return badInput("pool", p)
	}
	// The listings' page size, checked as they check it.
	f, err := h.parseFilter(url.Values{"limit": q["limit"]})
	if err != nil {
		return err
	}
	d.Limit = f.Limit
	if !d.System {
		// A submission's requests are many tenants' jobs and its pool is
		// shared: like the pools' live state, not a tenant's to see.
		return nil
	}
	// Operator.List has no cursor: one more than the page says whether
	// there are more, and a larger page shows them.
	subs, err := h.batches.List(ctx, h.cfg.DB, d.Pool, d.Limit+1)
	if err != nil {
		return fmt.Errorf("console: listing provider batches: %w", err)
	}
	if len(subs) > d.Limit {
		subs = subs[:d.Limit]
		if d.Limit < maxBatchesLimit {
			d.MoreQuery = pageQuery("pool", d.Pool, min(2*d.Limit, maxBatchesLimit))
		} else {
			d.AtMost = true
		}
	}
	d.Subs = make([]batchRow, len(subs))
	for i, s := range subs {
		d.Subs[i] = batchRow{Submission: s, ErrorLine: firstLine(s.LastError), Open: s.State != "ended"}
	}
	return nil
}

// pageQuery is a listing page's query string for its one filter (field
// set to value, left out when empty) and a page size (the default left
// out): the batches page's pool, the reuse page's kind.
func pageQuery(field, value string, limit int) template.URL {
	v := url.Values{}
	if value != "" {
		v.Set(field, value)
	}
	if limit != DefaultPageSize {
		v.Set("limit", strconv.Itoa(limit))
	}
	return template.URL(v.Encode()) // #nosec G203 -- url.Values.Encode escapes every value
}

// firstLine is s up to its first line break: a provider's error can run
// to a stack of lines, and the listing has room for one.
func firstLine(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}

// cancelBatch does what `llmq batches cancel` does: marks an open
// submission cancel_requested (providerbatch.Operator.Cancel), and the
// pool's submitter cancels the provider batch at its next poll.
func (h *Handler) cancelBatch(w http.ResponseWriter, r *http.Request, actor string) error {
	if h.cfg.Tenant != "" {
		return &httpError{status: http.StatusForbidden, msg: "provider batches hold every tenant's jobs: a tenant's console cannot cancel them"}
	}
	s := r.PathValue("id")
	id, err := uuid.Parse(s)
	if err != nil {
		return badInput("id", fmt.Sprintf("%q is not a submission id", truncate(40, s)))
	}
	// The form sends the page's pool filter back, to return to the same
	// list; it is checked as the page checks it.
	pool := r.PostFormValue("pool")
	if p := validate.Text(pool, false, admission.MaxPoolLen); p != "" {
		return badInput("pool", p)
	}
	if err := h.batches.Cancel(r.Context(), h.cfg.DB, id); err != nil {
		if errors.Is(err, providerbatch.ErrNotFound) {
			return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no open submission %s: none has that id, or it has ended", id)}
		}
		return fmt.Errorf("console: cancelling a provider batch: %w", err)
	}
	h.cfg.Logger.InfoContext(r.Context(), "console: batch cancel requested", "actor", actor, "submission", id)
	target := url.Values{"flash": {"batch-cancel"}}
	if pool != "" {
		target.Set("pool", pool)
	}
	http.Redirect(w, r, h.cfg.BasePath+"/batches?"+target.Encode(), http.StatusSeeOther)
	return nil
}
