package console_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/schedule"
)

// putSchedules stores an operator schedule per tenant given.
func (f *fixture) putSchedules(t *testing.T, names map[string]string) *schedule.Store {
	t.Helper()
	store, err := schedule.NewStore(schedule.StoreConfig{Schema: f.schema})
	require.NoError(t, err)
	for name, tenant := range names {
		require.NoError(t, store.Put(t.Context(), f.pool, schedule.Schedule{
			Name: name, Cron: "30 2 * * *", TimeZone: "Europe/Berlin",
			Job: jobs.EnqueueParams{Tenant: tenant, Kind: "digest.build", Payload: json.RawMessage(`{}`)},
		}))
	}
	return store
}

// The schedules page lists each schedule with its next and last slot; a
// tenant's console lists only the tenant's.
func TestSchedulesPage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.putSchedules(t, map[string]string{"acme-nightly": "acme", "globex-hourly": "globex"})

	code, body := get(t, f.console(t, console.Config{}), "/schedules")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<bdi>acme-nightly</bdi>`)
	require.Contains(t, body, `<bdi>globex-hourly</bdi>`)
	require.Contains(t, body, `<td class="mono">30 2 * * *</td>`)
	require.Contains(t, body, `<td>Europe/Berlin</td>`)
	require.Contains(t, body, `<span class="muted">never</span>`, "no slot enqueued yet")
	require.NotContains(t, body, "<form", "read-only without actions")

	_, body = get(t, f.console(t, console.Config{Tenant: "acme"}), "/schedules")
	require.Contains(t, body, "acme-nightly")
	require.NotContains(t, body, "globex", "another tenant's schedule is not shown")
}

// With actions, a schedule is paused and resumed from the page, under the
// CSRF and actor checks every action has; a tenant's console cannot touch
// another tenant's schedule.
func TestSchedulesPauseAndResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	store := f.putSchedules(t, map[string]string{"acme-nightly": "acme", "globex-hourly": "globex"})
	user := http.Header{"X-Test-User": {"ops@example.com"}}

	s := &session{t: t, h: f.console(t, console.Config{EnableActions: true})}
	_, body := s.get("/schedules")
	require.Contains(t, body, `action="/schedules/acme-nightly/pause"`)
	token := csrfFrom(t, body)

	rec := s.post("/schedules/acme-nightly/pause", url.Values{}, user)
	require.Equal(t, http.StatusForbidden, rec.Code, "no CSRF token")
	rec = s.post("/schedules/acme-nightly/pause", url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	require.Equal(t, "/schedules?flash=schedule-paused", rec.Header().Get("Location"))
	st, err := store.Get(t.Context(), f.pool, "acme-nightly")
	require.NoError(t, err)
	require.True(t, st.Paused)
	_, body = s.get(rec.Header().Get("Location"))
	require.Contains(t, body, "Schedule paused")
	require.Contains(t, body, `action="/schedules/acme-nightly/resume"`)

	rec = s.post("/schedules/acme-nightly/resume", url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusSeeOther, rec.Code, rec.Body.String())
	st, err = store.Get(t.Context(), f.pool, "acme-nightly")
	require.NoError(t, err)
	require.False(t, st.Paused)

	rec = s.post("/schedules/no-such/pause", url.Values{"csrf_token": {token}}, user)
	require.Equal(t, http.StatusNotFound, rec.Code)

	tenant := &session{t: t, h: f.console(t, console.Config{EnableActions: true, Tenant: "acme"})}
	_, body = tenant.get("/schedules")
	rec = tenant.post("/schedules/globex-hourly/pause", url.Values{"csrf_token": {csrfFrom(t, body)}}, user)
	require.Equal(t, http.StatusNotFound, rec.Code, "another tenant's schedule reads as none")
	st, err = store.Get(t.Context(), f.pool, "globex-hourly")
	require.NoError(t, err)
	require.False(t, st.Paused)
}
