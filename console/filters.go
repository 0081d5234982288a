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

// validQueue and validKind check the names jobs accepts for a queue and a
// kind.
func validQueue(s string) bool { return len(s) <= jobs.MaxQueueLen && namePattern.MatchString(s) }

func validKind(s string) bool { return len(s) <= jobs.MaxKindLen && namePattern.MatchString(s) }

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
	if f.Queue != "" && !validQueue(f.Queue) {
		return f, badInput("queue", fmt.Sprintf("%q is not a queue name (letters, digits, '.', '_' and '-', at most %d bytes)", truncate(40, f.Queue), jobs.MaxQueueLen))
	}
	if f.Kind != "" && !validKind(f.Kind) {
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

// maxParamLen bounds every query or form value the console accepts; the
// longest legitimate one is a replay's reason.
const maxParamLen = 4096

// checkParams refuses, naming the parameter, any name or value that
// PostgreSQL text cannot hold (invalid UTF-8, NUL) or that is longer than
// any the console writes, so that no statement ever runs with one: every
// page and action passes its query string and form through it first.
func checkParams(values url.Values) error {
	for name, list := range values {
		if !validate.Storable(name) || len(name) > 100 {
			return badInput(truncate(40, validate.MakeStorable(name)), "is not a parameter of this console")
		}
		for _, v := range list {
			switch {
			case !validate.Storable(v):
				return badInput(name, "is not valid UTF-8 text without NUL")
			case len(v) > maxParamLen:
				return badInput(name, fmt.Sprintf("is %d bytes, more than the limit of %d", len(v), maxParamLen))
			}
		}
	}
	return nil
}

// tenantCursor reads the tenants page's cursor (after_queue, after_tenant).
func tenantCursor(q url.Values) (queue, tenant string, err error) {
	queue, tenant = q.Get("after_queue"), q.Get("after_tenant")
	if queue != "" && !validQueue(queue) {
		return "", "", badInput("after_queue", "is not a cursor this page wrote")
	}
	if p := validate.Text(tenant, false, jobs.MaxTenantLen); p != "" {
		return "", "", badInput("after_tenant", p)
	}
	return queue, tenant, nil
}
