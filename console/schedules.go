package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/schedule"
)

// schedulesData is the schedules page: every schedule (package schedule)
// with its next and last slot; on a tenant's console, those whose jobs
// are the tenant's.
type schedulesData struct {
	Schedules []schedule.Status
}

func (h *Handler) schedulesPage(ctx context.Context, _ *http.Request, v *view) error {
	v.Title = "Schedules"
	list, err := h.schedules.List(ctx, h.cfg.DB)
	if err != nil {
		return fmt.Errorf("console: listing schedules: %w", err)
	}
	d := &schedulesData{}
	for _, st := range list {
		if h.cfg.Tenant == "" || st.Job.Tenant == h.cfg.Tenant {
			d.Schedules = append(d.Schedules, st)
		}
	}
	v.Data = d
	return nil
}

// pauseSchedule and resumeSchedule are the page's actions, on the
// schedule the path names; a tenant's console acts only on the tenant's
// own schedules.
func (h *Handler) pauseSchedule(w http.ResponseWriter, r *http.Request, actor string) error {
	return h.changeSchedule(w, r, actor, "paused", h.schedules.Pause)
}

func (h *Handler) resumeSchedule(w http.ResponseWriter, r *http.Request, actor string) error {
	return h.changeSchedule(w, r, actor, "resumed", h.schedules.Resume)
}

func (h *Handler) changeSchedule(w http.ResponseWriter, r *http.Request, actor, done string,
	change func(context.Context, llmqtype.DBTX, string) error) error {
	name := r.PathValue("name")
	if p := validate.Text(name, true, schedule.MaxNameLen); p != "" {
		return badInput("name", p)
	}
	st, err := h.schedules.Get(r.Context(), h.cfg.DB, name)
	switch {
	case errors.Is(err, schedule.ErrNotFound) || (err == nil && h.cfg.Tenant != "" && st.Job.Tenant != h.cfg.Tenant):
		// Another tenant's schedule reads as none, as its jobs do.
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("no schedule is named %q", truncate(60, name))}
	case err != nil:
		return fmt.Errorf("console: reading schedule %q: %w", name, err)
	}
	if err := change(r.Context(), h.cfg.DB, name); err != nil {
		return fmt.Errorf("console: schedule %q: %w", name, err)
	}
	h.cfg.Logger.InfoContext(r.Context(), "console: schedule "+done, "actor", actor, "schedule", name)
	http.Redirect(w, r, h.cfg.BasePath+"/schedules?"+url.Values{"flash": {"schedule-" + done}}.Encode(), http.StatusSeeOther)
	return nil
}
