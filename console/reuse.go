package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
)

// reuseSource is the job whose result a job (jobs.Job.ReusedFrom) or one
// of its attempts (jobs.Attempt.ReusedFrom) took, as the job page shows
// it: linked when this console shows that job, else its id alone and why.
type reuseSource struct {
	ID    uuid.UUID
	Base  string
	Shown bool
	// Tenant is the source's tenant when it is another than the job's:
	// a shared key's result, on an operator's console.
	Tenant string
	Why    string // why it is not shown
}

// reuseSources finds the sources of job and of its reused attempts, each
// read once as the console reads any job (findJob): through the scoped
// tenant's keys on a tenant's console, so a source of another tenant is
// not found there, exactly like one retention has pruned.
func (h *Handler) reuseSources(ctx context.Context, job *jobs.Job, attempts []attemptView) (*reuseSource, error) {
	found := map[uuid.UUID]*reuseSource{}
	resolve := func(id uuid.UUID) (*reuseSource, error) {
		if id == uuid.Nil {
			return nil, nil
		}
		if s, ok := found[id]; ok {
			return s, nil
		}
		s := &reuseSource{ID: id, Base: h.cfg.BasePath}
		src, err := h.findJob(ctx, id)
		switch {
		case errors.Is(err, jobs.ErrNotFound):
			s.Why = "no longer kept: retention has pruned it"
			if h.cfg.Tenant != "" && job.Reuse != nil && job.Reuse.Shared {
				s.Why = "not shown here: another tenant's job under the shared key, or one no longer kept"
			}
		case err != nil:
			return nil, err
		default:
			s.Shown = true
			if src.Tenant != job.Tenant {
				s.Tenant = src.Tenant
			}
		}
		found[id] = s
		return s, nil
	}
	for i := range attempts {
		s, err := resolve(attempts[i].ReusedFrom)
		if err != nil {
			return nil, err
		}
		attempts[i].Source = s
	}
	return resolve(job.ReusedFrom)
}

type reuseData struct {
	Invalidations []jobs.ReuseInvalidation
	Kind          string // the kind filter; "" for every kind
	Limit         int
	// MoreQuery shows more of the newest invalidations, when more exist
	// and the page is not at its largest; AtMost says it is and more
	// exist.
	MoreQuery template.URL
	AtMost    bool
	// Recorded is the invalidation an action just recorded, and Covered
	// how many computed results it covered.
	Recorded *jobs.ReuseInvalidation
	Covered  int64
	MaxTTL   int // jobs.MaxReuseTTL in days: how far back Covered counts
}

// maxReuseLimit is the largest page the reuse page shows, as the
// listings' limit.
const maxReuseLimit = 500

func (h *Handler) reusePage(ctx context.Context, r *http.Request, v *view) error {
	v.Title = "Result reuse"
	q := r.URL.Query()
	d := &reuseData{Kind: q.Get("kind"), Limit: DefaultPageSize, MaxTTL: int(jobs.MaxReuseTTL / (24 * time.Hour))}
	v.Data = d
	// The kind and the page size, checked as the listings check them.
	f, err := h.parseFilter(url.Values{"kind": q["kind"], "limit": q["limit"]})
	if err != nil {
		return err
	}
	d.Limit = f.Limit
	if err := h.recorded(ctx, q, d); err != nil {
		return err
	}
	// One more than the page says whether there are more, and a larger
	// page shows them, as on the batches page.
	list, err := h.invalidations(ctx, d.Kind, d.Limit+1)
	if err != nil {
		return err
	}
	if len(list) > d.Limit {
		list = list[:d.Limit]
		if d.Limit < maxReuseLimit {
			d.MoreQuery = pageQuery("kind", d.Kind, min(2*d.Limit, maxReuseLimit))
		} else {
			d.AtMost = true
		}
	}
	d.Invalidations = list
	return nil
}

// invalidations reads up to limit invalidations newest first, of kind
// unless "": every one on an operator's console, the scoped tenant's and
// every tenant's on a tenant's.
func (h *Handler) invalidations(ctx context.Context, kind string, limit int) ([]jobs.ReuseInvalidation, error) {
	rows, err := h.cfg.DB.Query(ctx, h.sql.reuseInvalidations, kind, h.cfg.Tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("console: listing reuse invalidations: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanInvalidation)
	if err != nil {
		return nil, fmt.Errorf("console: listing reuse invalidations: %w", err)
	}
	return out, nil
}

func scanInvalidation(row pgx.CollectableRow) (jobs.ReuseInvalidation, error) {
	var r invalidationRow
	err := row.Scan(r.dest()...)
	return r.invalidation(), err
}

// recorded reads the invalidation an action's redirect names (recorded,
// covered and the proof that the console wrote both), under the page's
// tenant rule.
func (h *Handler) recorded(ctx context.Context, q url.Values, d *reuseData) error {
	s := q.Get("recorded")
	if s == "" {
		return nil
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return badInput("recorded", "is not an invalidation this console recorded")
	}
	covered, err := strconv.ParseInt(q.Get("covered"), 10, 64)
	if err != nil || covered < 0 {
		return badInput("covered", "is not a count this console wrote")
	}
	if !hmac.Equal([]byte(q.Get("proof")), []byte(h.recordedProof(id, covered))) {
		return badInput("proof", "does not match: the console did not write this result")
	}
	rows, err := h.cfg.DB.Query(ctx, h.sql.reuseInvalidation, id, h.cfg.Tenant)
	if err != nil {
		return fmt.Errorf("console: reading reuse invalidation %d: %w", id, err)
	}
	list, err := pgx.CollectRows(rows, scanInvalidation)
	if err != nil {
		return fmt.Errorf("console: reading reuse invalidation %d: %w", id, err)
	}
	if len(list) == 1 { // none when retention has pruned it since
		d.Recorded, d.Covered = &list[0], covered
	}
	return nil
}

// recordedProof signs what an invalidation's redirect carries, its id
// and the count of results it covered, with Config.CSRFKey: the count is
// not stored anywhere, and the page shows it only as the console wrote
// it, so a link cannot make it claim another.
func (h *Handler) recordedProof(id, covered int64) string {
	m := hmac.New(sha256.New, h.cfg.CSRFKey)
	fmt.Fprintf(m, "llmq console reuse invalidation\x00%d\x00%d", id, covered)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// invalidateReuse records an invalidation through
// jobs.PostgresStore.InvalidateReuse, by the actor, and returns to the
// reuse page showing it and how many results it covered.
func (h *Handler) invalidateReuse(w http.ResponseWriter, r *http.Request, actor string) error {
	p, err := h.invalidationFromForm(r)
	if err != nil {
		return err
	}
	p.By = actor
	inv, covered, err := h.store.InvalidateReuse(r.Context(), h.cfg.DB, p)
	if err != nil {
		return err
	}
	h.cfg.Logger.InfoContext(r.Context(), "console: reuse invalidated", "actor", actor, "invalidation", inv.ID,
		"kind", inv.Kind, "key", inv.Key, "tenant", inv.Tenant, "covered", covered, "reason", inv.Reason)
	target := url.Values{"kind": {inv.Kind}, "recorded": {strconv.FormatInt(inv.ID, 10)},
		"covered": {strconv.FormatInt(covered, 10)}, "proof": {h.recordedProof(inv.ID, covered)}}
	http.Redirect(w, r, h.cfg.BasePath+"/reuse?"+target.Encode(), http.StatusSeeOther)
	return nil
}

// invalidationFromForm reads and checks the invalidation form, naming
// the form's fields. On a tenant's console the tenant is the console's
// own whatever the form says: an empty one (every tenant) is narrowed to
// it, and another is refused (403), as the listings' tenant filter is.
func (h *Handler) invalidationFromForm(r *http.Request) (jobs.InvalidateReuseParams, error) {
	p := jobs.InvalidateReuseParams{Kind: r.PostFormValue("kind"), Key: r.PostFormValue("key"),
		Tenant: r.PostFormValue("tenant"), Reason: r.PostFormValue("reason")}
	switch {
	case p.Kind == "":
		return p, badInput("kind", "is required: say which kind's results are not to be reused again")
	case !validKind(p.Kind):
		return p, badInput("kind", fmt.Sprintf("%q is not a kind (letters, digits, '.', '_' and '-', at most %d bytes)", truncate(40, p.Kind), jobs.MaxKindLen))
	}
	if problem := validate.Text(p.Key, false, jobs.MaxReuseKeyLen); problem != "" {
		return p, badInput("key", problem)
	}
	if problem := validate.Text(p.Tenant, false, jobs.MaxTenantLen); problem != "" {
		return p, badInput("tenant", problem)
	}
	if h.cfg.Tenant != "" {
		if p.Tenant != "" && p.Tenant != h.cfg.Tenant {
			return p, &httpError{status: http.StatusForbidden, msg: "tenant: this console invalidates only its own tenant's results"}
		}
		p.Tenant = h.cfg.Tenant
	}
	if strings.TrimSpace(p.Reason) == "" {
		return p, badInput("reason", "is required: say why these results must not be reused (it is recorded with the invalidation)")
	}
	if problem := validate.Text(p.Reason, true, 1000); problem != "" {
		return p, badInput("reason", problem)
	}
	return p, nil
}
