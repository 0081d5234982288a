package console_test

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/console"
	"github.com/llmq/llmq/jobs"
)

// The overview's Health section: each figure is graded
// against console.Config.Health and says its state in words.

// healthSection returns the Health section of the overview.
func healthSection(t *testing.T, h http.Handler) string {
	t.Helper()
	code, body := get(t, h, "/")
	require.Equal(t, http.StatusOK, code, body)
	s := regexp.MustCompile(`(?s)<section class="health.*?</section>`).FindString(body)
	require.NotEmpty(t, s, "no Health section")
	return s
}

// figureState returns the state label of a Health figure (data-health),
// within the row of queue when queue is not "".
func figureState(t *testing.T, section, queue, figure string) string {
	t.Helper()
	if queue != "" {
		row := regexp.MustCompile(`(?s)<tr data-queue="` + regexp.QuoteMeta(queue) + `">.*?</tr>`).FindString(section)
		require.NotEmpty(t, row, "no Health row for queue %s", queue)
		section = row
	}
	m := regexp.MustCompile(`<span class="hs hs-(\w+)" data-health="` + figure + `">(\w+)</span>`).FindStringSubmatch(section)
	require.NotNil(t, m, "no %s figure in:\n%s", figure, section)
	require.Equal(t, m[1], m[2], "the class and the label agree")
	return m[2]
}

func (f *fixture) exec(t *testing.T, sql string) {
	t.Helper()
	_, err := f.pool.Exec(t.Context(), strings.ReplaceAll(sql, "SCHEMA.", `"`+f.schema+`".`))
	require.NoError(t, err)
}

// The oldest runnable job's age turns a queue amber, then red, at the
// thresholds (at or above each).
func TestHealthOldestRunnableThresholds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// The default queue holds only jobs scheduled for later: give it one
	// due ten minutes ago.
	_, err := f.store.Enqueue(t.Context(), f.pool, jobs.EnqueueParams{Tenant: "acme", Kind: "webhook.deliver", Queue: "default",
		Payload: []byte(`{}`), AvailableAt: time.Now().Add(-10 * time.Minute)})
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		cfg  console.Thresholds
		want string
	}{
		{"defaults: 5m amber", console.Thresholds{}, "warning"},
		{"below amber", console.Thresholds{OldestRunnableAmber: 11 * time.Minute, OldestRunnableRed: 12 * time.Minute}, "ok"},
		{"at amber", console.Thresholds{OldestRunnableAmber: 10 * time.Minute, OldestRunnableRed: 11 * time.Minute}, "warning"},
		{"at red", console.Thresholds{OldestRunnableAmber: 9 * time.Minute, OldestRunnableRed: 10 * time.Minute}, "critical"},
	} {
		s := healthSection(t, f.console(t, console.Config{Health: c.cfg}))
		require.Equal(t, c.want, figureState(t, s, "default", "age"), c.name)
		// The extraction queue's jobs were due just now.
		require.Equal(t, "ok", figureState(t, s, "extraction", "age"), c.name)
	}
}

// The extraction queue's attempts of the last hour: per tenant one
// succeeded, one failed, one review and one retry, so 4 failures of 8
// attempts that ran (50%).
func TestHealthFailureRateThresholds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		name string
		cfg  console.Thresholds
		want string
	}{
		{"defaults: too few failures to grade", console.Thresholds{}, "ok"},
		{"one failure short of the minimum", console.Thresholds{FailureMinFailures: 5}, "ok"},
		{"at the minimum: 50% is above the 25% red", console.Thresholds{FailureMinFailures: 4}, "critical"},
		{"below amber", console.Thresholds{FailureMinFailures: 4, FailureRateAmber: 0.51, FailureRateRed: 0.6}, "ok"},
		{"at amber", console.Thresholds{FailureMinFailures: 4, FailureRateAmber: 0.5, FailureRateRed: 0.6}, "warning"},
		{"at red", console.Thresholds{FailureMinFailures: 4, FailureRateAmber: 0.2, FailureRateRed: 0.5}, "critical"},
	} {
		s := healthSection(t, f.console(t, console.Config{Health: c.cfg}))
		require.Equal(t, c.want, figureState(t, s, "extraction", "rate"), c.name)
		require.Contains(t, s, "50.0% <span class=\"muted\">(4 of 8)</span>", c.name)
		require.Equal(t, "ok", figureState(t, s, "default", "rate"), c.name)
	}
}

// Two jobs became dead letters in the last hour and two await review.
func TestHealthDeadLettersAndReviewThresholds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, c := range []struct {
		name         string
		cfg          console.Thresholds
		dead, review string
	}{
		{"defaults", console.Thresholds{}, "warning", "warning"},
		{"below amber", console.Thresholds{DeadLettersAmber: 3, DeadLettersRed: 4, ReviewAmber: 3, ReviewRed: 4}, "ok", "ok"},
		{"at amber", console.Thresholds{DeadLettersAmber: 2, DeadLettersRed: 3, ReviewAmber: 2, ReviewRed: 3}, "warning", "warning"},
		{"at red", console.Thresholds{DeadLettersRed: 2, ReviewRed: 2}, "critical", "critical"},
	} {
		s := healthSection(t, f.console(t, console.Config{Health: c.cfg}))
		require.Equal(t, c.dead, figureState(t, s, "", "dead"), c.name)
		require.Equal(t, c.review, figureState(t, s, "", "review"), c.name)
		require.Contains(t, s, `<a href="/dead">2</a>, 2 in the last hour`, c.name)
	}
}

// Events waiting while no relay holds the leader lease are red whatever
// their age; with a live relay the lag is graded.
func TestHealthOutboxWithoutRelayIsRed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	s := healthSection(t, h)
	require.Equal(t, "critical", figureState(t, s, "", "outbox"))
	require.Contains(t, s, "no live relay lease")
	require.Equal(t, "critical", figureState(t, s, "", "overall"))

	f.exec(t, `UPDATE SCHEMA.outbox_relay_lease SET holder = 'relay-1', lease_until = now() + interval '1 minute', acquired_at = now()`)
	s = healthSection(t, h)
	require.Equal(t, "ok", figureState(t, s, "", "outbox"))
	require.Contains(t, s, "held by relay-1")

	f.exec(t, `UPDATE SCHEMA.outbox SET created_at = now() - interval '3 minutes' WHERE published_at IS NULL`)
	f.exec(t, `UPDATE SCHEMA.outbox_batches SET created_at = now() - interval '3 minutes' WHERE published_at IS NULL`)
	for _, c := range []struct {
		name string
		cfg  console.Thresholds
		want string
	}{
		{"defaults: 2m amber", console.Thresholds{}, "warning"},
		{"below amber", console.Thresholds{OutboxLagAmber: 4 * time.Minute, OutboxLagRed: 5 * time.Minute}, "ok"},
		{"at red", console.Thresholds{OutboxLagAmber: time.Minute, OutboxLagRed: 3 * time.Minute}, "critical"},
	} {
		s := healthSection(t, f.console(t, console.Config{Health: c.cfg}))
		require.Equal(t, c.want, figureState(t, s, "", "outbox"), c.name)
	}

	// Nothing waits: no relay is needed.
	f.exec(t, `UPDATE SCHEMA.outbox_relay_lease SET holder = NULL, lease_until = '-infinity'`)
	f.exec(t, `UPDATE SCHEMA.outbox SET published_at = now() WHERE published_at IS NULL`)
	f.exec(t, `UPDATE SCHEMA.outbox_batches SET published_at = now() WHERE published_at IS NULL`)
	s = healthSection(t, h)
	require.Equal(t, "ok", figureState(t, s, "", "outbox"))
	require.Contains(t, s, "0 unpublished")
}

// Retention is amber when it never ran and nobody holds its lease, or
// when its last pass is older than RetentionAmber.
func TestHealthRetentionLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	s := healthSection(t, h)
	require.Equal(t, "warning", figureState(t, s, "", "retention"))
	require.Contains(t, s, "last pass: never")

	f.exec(t, `UPDATE SCHEMA.retention_lease SET holder = 'runner-7', lease_until = now() + interval '3 minutes', acquired_at = now(), last_pass_at = now()`)
	s = healthSection(t, h)
	require.Equal(t, "ok", figureState(t, s, "", "retention"))
	require.Contains(t, s, "held by runner-7")

	f.exec(t, `UPDATE SCHEMA.retention_lease SET lease_until = now() - interval '1 minute', last_pass_at = now() - interval '20 minutes'`)
	s = healthSection(t, h)
	require.Equal(t, "warning", figureState(t, s, "", "retention"))
	require.Contains(t, s, "last held by runner-7")
	s = healthSection(t, f.console(t, console.Config{Health: console.Thresholds{RetentionAmber: 21 * time.Minute}}))
	require.Equal(t, "ok", figureState(t, s, "", "retention"))
}

// A tenant's console grades the tenant's own figures and shows no system
// service: no outbox, relay or retention.
func TestHealthTenantConsole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{Tenant: "acme", Health: console.Thresholds{FailureMinFailures: 2}})
	s := healthSection(t, h)
	for _, system := range []string{`data-health="outbox"`, `data-health="retention"`, "Outbox", "Retention", "relay", "globex"} {
		require.NotContains(t, s, system)
	}
	// acme's own: one dead letter, one review, 2 failures of 4 attempts.
	require.Contains(t, s, `<a href="/dead">1</a>, 1 in the last hour`)
	require.Contains(t, s, `<a href="/dead?state=REVIEW_REQUIRED">1</a>`)
	require.Contains(t, s, "50.0% <span class=\"muted\">(2 of 4)</span>")
	require.Equal(t, "critical", figureState(t, s, "extraction", "rate"))
	require.Equal(t, "warning", figureState(t, s, "", "dead"))
	// The refreshed fragment too.
	code, body := get(t, h, "/?fragment=live")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Health")
	require.NotContains(t, body, `data-health="outbox"`)
}

// Invalid thresholds are refused by New, naming the field.
func TestHealthThresholdsValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for field, th := range map[string]console.Thresholds{
		"Health.OldestRunnableAmber": {OldestRunnableAmber: -time.Second},
		"Health.OldestRunnableRed":   {OldestRunnableRed: -time.Second},
		"Health.FailureRateRed":      {FailureRateRed: 1.5},
		"Health.FailureMinFailures":  {FailureMinFailures: -1},
		"Health.DeadLettersAmber":    {DeadLettersAmber: 20}, // above the default red, 10
		"Health.ReviewAmber":         {ReviewAmber: 5, ReviewRed: 4},
		"Health.OutboxLagAmber":      {OutboxLagAmber: 5 * time.Minute, OutboxLagRed: time.Minute},
		"Health.FailureRateAmber":    {FailureRateAmber: 0.5, FailureRateRed: 0.3},
		"Health.RetentionAmber":      {RetentionAmber: -time.Minute},
	} {
		_, err := console.New(console.Config{DB: f.pool, Schema: f.schema, Health: th})
		require.ErrorIs(t, err, console.ErrInvalidConfig, field)
		require.Contains(t, err.Error(), field+" ", field)
	}
	_, err := console.New(console.Config{DB: f.pool, Schema: f.schema, Health: console.Thresholds{
		OldestRunnableAmber: time.Minute, OldestRunnableRed: time.Minute, FailureRateAmber: 1, FailureRateRed: 1}})
	require.NoError(t, err, "amber equal to red is allowed")
}

// The finished-per-minute chart has a y scale (its maximum and half of
// it) and time labels.
func TestChartScale(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	code, body := get(t, f.console(t, console.Config{}), "/")
	require.Equal(t, http.StatusOK, code)
	chart := regexp.MustCompile(`(?s)<svg class="chart".*?</svg>`).FindString(body)
	// Six jobs finished this minute (2 succeeded, 2 review, 2 failed).
	labels := regexp.MustCompile(`class="ylabel">([^<]+)<`).FindAllStringSubmatch(chart, -1)
	require.Len(t, labels, 2, chart)
	require.Equal(t, "6/min", labels[0][1])
	require.Equal(t, "3/min", labels[1][1])
	require.Equal(t, 2, strings.Count(chart, `class="grid"`))
	require.Regexp(t, `class="xlabel">\d\d:\d\d`, chart)
}

// In the browser, the Health section shows each figure's state in words,
// keeps it through the live refresh, and the chart shows its scale.
func TestBrowserHealth(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv := httptest.NewServer(f.console(t, console.Config{RefreshInterval: 300 * time.Millisecond}))
	t.Cleanup(srv.Close)
	b := newBrowser(t)
	b.do(chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("section.health")))
	b.do(chromedp.WaitVisible(chromedp.CSS("[data-fragment][data-refreshed] section.health")))
	text := run(b, chromedp.Text(chromedp.CSS("section.health")))
	require.Contains(t, text, "Health")
	require.Contains(t, text, "no live relay lease")
	for _, figure := range []string{"overall", "outbox"} {
		got := run(b, chromedp.Evaluate[string](`document.querySelector('[data-health="`+figure+`"]').textContent`))
		require.Equal(t, "critical", got, figure)
	}
	require.Equal(t, "warning", run(b, chromedp.Evaluate[string](`document.querySelector('[data-health="dead"]').textContent`)))
	// The label is styled (not colour alone: the word is there too).
	bg := run(b, chromedp.Evaluate[string](`getComputedStyle(document.querySelector('[data-health="outbox"]')).backgroundColor`))
	require.Equal(t, "rgb(251, 226, 224)", bg)
	ylabels := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("svg.chart .ylabel")].map(e => e.textContent)`))
	require.Equal(t, []string{"6/min", "3/min"}, ylabels)
	xlabels := run(b, chromedp.Evaluate[[]string](`[...document.querySelectorAll("svg.chart .xlabel")].map(e => e.textContent)`))
	require.NotEmpty(t, xlabels)
	// The scale's labels are drawn within the chart.
	inside := run(b, chromedp.Evaluate[bool](`(() => { const s = document.querySelector("svg.chart").getBoundingClientRect();
		return [...document.querySelectorAll("svg.chart .ylabel")].every(e => { const r = e.getBoundingClientRect();
		return r.width > 0 && r.top >= s.top && r.bottom <= s.bottom; }); })()`))
	require.True(t, inside)
	b.screenshot("overview-health")
	b.requireNoConsoleErrors("/")
}
