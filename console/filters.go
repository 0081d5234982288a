package console

import (
	"fmt"
	"html/template"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

func validName(s string, maxLen int) bool { return len(s) <= maxLen && namePattern.MatchString(s) }

// jobFilter is what the jobs and dead-letter pages filter by, read from
// the query string; Parse refuses bad values with a 400 naming the field.
type jobFilter struct {
	Queue, Kind, Tenant string
	States              []string
	From, To            time.Time // created (jobs) or finished (dead letters), From inclusive, To exclusive
	FromText, ToText    string
	Limit               int
}

// timeLayouts are what the time filters accept: RFC 3339, and what an
// HTML datetime-local input sends (read as UTC).
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"}

func parseTime(field, s string) (time.Time, error) {
	for _, layout := range timeLayouts {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badInput(field, fmt.Sprintf("%q is not a time; use RFC 3339 (2026-01-02T15:04:05Z) or 2026-01-02T15:04", truncate(40, s)))
}

func (h *Handler) parseFilter(q url.Values) (jobFilter, error) {
	f := jobFilter{Queue: q.Get("queue"), Kind: q.Get("kind"), Tenant: q.Get("tenant"), Limit: DefaultPageSize}
	if f.Queue != "" && !validName(f.Queue, jobs.MaxQueueLen) {
		return f, badInput("queue", fmt.Sprintf("%q is not a queue name (letters, digits, '.', '_' and '-', at most %d bytes)", truncate(40, f.Queue), jobs.MaxQueueLen))
	}
	if f.Kind != "" && !validName(f.Kind, jobs.MaxKindLen) {
		return f, badInput("kind", fmt.Sprintf("%q is not a kind (letters, digits, '.', '_' and '-', at most %d bytes)", truncate(40, f.Kind), jobs.MaxKindLen))
	}
	if f.Tenant != "" {
		if p := validate.Text(f.Tenant, false, jobs.MaxTenantLen); p != "" {
			return f, badInput("tenant", p)
		}
	}
	if h.cfg.Tenant != "" {
		if f.Tenant != "" && f.Tenant != h.cfg.Tenant {
			return f, &httpError{status: 403, msg: "tenant: this console shows only its own tenant's jobs"}
		}
		f.Tenant = h.cfg.Tenant
	}
	for _, s := range q["state"] {
		for name := range strings.SplitSeq(s, ",") {
			name = strings.ToUpper(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			if !jobs.State(name).Valid() {
				return f, badInput("state", fmt.Sprintf("%q is not a state; use %s", truncate(40, name), stateList()))
			}
			f.States = append(f.States, name)
		}
	}
	var err error
	if f.FromText = q.Get("from"); f.FromText != "" {
		if f.From, err = parseTime("from", f.FromText); err != nil {
			return f, err
		}
	}
	if f.ToText = q.Get("to"); f.ToText != "" {
		if f.To, err = parseTime("to", f.ToText); err != nil {
			return f, err
		}
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return f, badInput("to", "must be after from")
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 500 {
			return f, badInput("limit", fmt.Sprintf("%q: use a page size of 1 to 500", truncate(20, s)))
		}
		f.Limit = n
	}
	return f, nil
}

func stateList() string {
	names := make([]string, 0, 7)
	for _, s := range jobs.States() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}

// query writes the filter back as a query string, with extra pairs.
func (f jobFilter) query(extra ...string) template.URL {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("queue", f.Queue)
	set("kind", f.Kind)
	set("tenant", f.Tenant)
	set("from", f.FromText)
	set("to", f.ToText)
	for _, s := range f.States {
		v.Add("state", s)
	}
	if f.Limit != DefaultPageSize {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	for i := 0; i+1 < len(extra); i += 2 {
		set(extra[i], extra[i+1])
	}
	return template.URL(v.Encode()) // #nosec G203 -- url.Values.Encode escapes every value
}

func parseID(field, s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, badInput(field, fmt.Sprintf("%q is not a job id", truncate(40, s)))
	}
	return id, nil
}
