package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/jobs"
)

// Charts are inline SVG drawn by the templates from these shapes: no
// script, no library.

// barChart is a bar chart in a 600×160 view box (plus axis labels).
type barChart struct {
	Width, Height float64
	Bars          []bar
	Labels        []axisLabel
	// Scale is the y axis: a gridline and label at the maximum and at
	// half of it (none for an empty chart).
	Scale []scaleLine
	Base  float64 // the bars' baseline
	Max   int64
	Empty bool
	// Capped: some bar is a lower bound (a count stopped at its cap), and
	// so may Max be.
	Capped bool
}

type bar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type axisLabel struct {
	X, Y   float64
	Text   string
	Anchor string
}

// scaleLine is a y-axis gridline at Y with its value's label.
type scaleLine struct {
	Y, LabelY float64
	Text      string
}

// yScale labels a chart's maximum and half of it, at the heights the
// bars drawn at scale reach.
func (c *barChart) yScale(scale float64, format func(int64) string) {
	if c.Max <= 0 {
		return
	}
	top := format(c.Max)
	if c.Capped {
		top = "≥ " + top
	}
	for _, v := range []struct {
		n    int64
		text string
	}{{c.Max, top}, {c.Max / 2, format(c.Max / 2)}} {
		if v.n <= 0 || (v.n == c.Max/2 && c.Max < 2) {
			continue
		}
		y := chartH - float64(v.n)*scale
		c.Scale = append(c.Scale, scaleLine{Y: y, LabelY: y + 12, Text: v.text})
	}
}

type legendEntry struct {
	Class, Text string
}

// The view box: chartH of bars and a band of axis labels below, scaled
// uniformly to the page's width.
const chartW, chartH, labelBand = 1000.0, 150.0, 18.0

// minuteChart stacks each minute's succeeded, review and failed counts.
func minuteChart(minutes []minuteCounts) barChart {
	c := barChart{Width: chartW, Height: chartH + labelBand, Base: chartH, Empty: true}
	for _, m := range minutes {
		c.Max = max(c.Max, m.Succeeded+m.Failed+m.Reviewed)
		c.Capped = c.Capped || m.Capped()
	}
	if len(minutes) == 0 {
		return c
	}
	scale := 1.0
	if c.Max > 0 {
		scale = (chartH - 4) / float64(c.Max)
		c.Empty = false
	}
	c.yScale(scale, func(n int64) string { return formatCount(n) + "/min" })
	w := chartW / float64(len(minutes))
	for i, m := range minutes {
		x, y := float64(i)*w, chartH
		for _, part := range []struct {
			n      int64
			capped bool
			class  string
			label  string
		}{{m.Succeeded, m.SucceededCapped, "ok", "succeeded"}, {m.Reviewed, m.ReviewedCapped, "review", "review required"}, {m.Failed, m.FailedCapped, "failed", "failed"}} {
			if part.n == 0 {
				continue
			}
			hgt := float64(part.n) * scale
			y -= hgt
			c.Bars = append(c.Bars, bar{X: x + 0.5, Y: y, W: max(w-1, 1), H: hgt, Class: part.class,
				Title: fmt.Sprintf("%s: %s %s", m.Minute.UTC().Format("15:04"), formatCapped(count{N: part.n, More: part.capped}), part.label)})
		}
		if m.Minute.Minute()%10 == 0 {
			c.Labels = append(c.Labels, label(x+w/2, m.Minute.UTC().Format("15:04")))
		}
	}
	// The last minute's label says where now is, unless a ten-minute
	// label sits right beside it.
	if last := minutes[len(minutes)-1]; last.Minute.Minute()%10 >= 3 {
		l := label(chartW-2, last.Minute.UTC().Format("15:04")+" UTC")
		l.Anchor = "end"
		c.Labels = append(c.Labels, l)
	}
	return c
}

func label(x float64, text string) axisLabel {
	return axisLabel{X: x, Y: chartH + labelBand - 4, Text: text, Anchor: "middle"}
}

// usageChart stacks each day's value (cost, or tokens) by tenant: the
// tenants with the most get their own colour, the rest share one. format
// writes a value for the bars' titles.
func usageChart(days []usageDay, from time.Time, n int, value func(usageDay) int64, format func(int64) string) (barChart, []legendEntry) {
	c := barChart{Width: chartW, Height: chartH + labelBand, Base: chartH, Empty: true}
	const colours = 6
	totals := map[string]int64{}
	for _, u := range days {
		totals[u.Tenant] += value(u)
	}
	rank := rankTenants(totals, colours)
	names := map[int]string{}
	for t := range totals {
		if k := rank(t); k < colours {
			names[k] = t
		}
	}
	names[colours] = "other tenants"
	perDay := make([]map[int]int64, n)
	start := time.Date(from.Year(), from.Month(), from.Day(), 0, 0, 0, 0, time.UTC)
	for _, u := range days {
		i := int(u.Day.Sub(start).Hours() / 24)
		if i < 0 || i >= n {
			continue
		}
		if perDay[i] == nil {
			perDay[i] = map[int]int64{}
		}
		perDay[i][rank(u.Tenant)] += value(u)
	}
	for _, d := range perDay {
		var sum int64
		for _, v := range d {
			sum += v
		}
		c.Max = max(c.Max, sum)
	}
	scale := 1.0
	if c.Max > 0 {
		scale = (chartH - 4) / float64(c.Max)
		c.Empty = false
	}
	w := chartW / float64(n)
	for i, d := range perDay {
		x, y := float64(i)*w, chartH
		day := start.AddDate(0, 0, i)
		for k := 0; k <= colours; k++ {
			if d[k] == 0 {
				continue
			}
			hgt := float64(d[k]) * scale
			y -= hgt
			c.Bars = append(c.Bars, bar{X: x + 1, Y: y, W: max(w-2, 1), H: hgt, Class: fmt.Sprintf("t%d", k),
				Title: fmt.Sprintf("%s (UTC), %s: %s", day.Format("2006-01-02"), names[k], format(d[k]))})
		}
		c.Labels = append(c.Labels, label(x+w/2, day.Format("Jan 2")))
	}
	var legend []legendEntry
	for _, t := range sortedByTotal(totals) {
		k := rank(t)
		if k == colours {
			legend = append(legend, legendEntry{Class: fmt.Sprintf("t%d", k), Text: "other tenants"})
			break
		}
		legend = append(legend, legendEntry{Class: fmt.Sprintf("t%d", k), Text: t})
	}
	return c, legend
}

// rankTenants gives the top tenants by total their own index and every
// other tenant the index top.
func rankTenants(totals map[string]int64, top int) func(string) int {
	idx := map[string]int{}
	for i, t := range sortedByTotal(totals) {
		if i < top {
			idx[t] = i
		}
	}
	return func(t string) int {
		if i, ok := idx[t]; ok {
			return i
		}
		return top
	}
}

func sortedByTotal(totals map[string]int64) []string {
	out := make([]string, 0, len(totals))
	for t := range totals {
		out = append(out, t)
	}
	for i := 1; i < len(out); i++ { // few tenants: insertion sort keeps it short
		for j := i; j > 0 && (totals[out[j]] > totals[out[j-1]] || (totals[out[j]] == totals[out[j-1]] && out[j] < out[j-1])); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// timelineBar places an attempt on the job's timeline, in percent of its
// width (Left, Width), and in the timeline's 1000-wide view box: X and W,
// at least timelineMinW wide so that a millisecond attempt beside a long
// retry delay still shows, and where its label goes (after the bar, or
// before it when the bar ends near the right edge).
type timelineBar struct {
	Left, Width float64
	X, W        float64
	LabelX      float64
	Anchor      string
	Inside      bool // the label sits on the bar
	Class       string
}

// timelineMinW is the narrowest bar of the attempt timeline, in view box
// units (a thousandth of its width).
const timelineMinW = 8.0

// timeline lays a job's attempts out on one time axis, from the first
// start to the last end (now for a live attempt).
func timeline(attempts []jobs.Attempt, now time.Time) []attemptView {
	out := make([]attemptView, len(attempts))
	if len(attempts) == 0 {
		return out
	}
	start, end := attempts[0].StartedAt, attempts[0].StartedAt
	for i, a := range attempts {
		stop := a.EndedAt
		if stop.IsZero() {
			stop = now
			out[i].Live = true
		}
		out[i].Attempt = a
		out[i].Duration = stop.Sub(a.StartedAt)
		if a.StartedAt.Before(start) {
			start = a.StartedAt
		}
		if stop.After(end) {
			end = stop
		}
	}
	span := end.Sub(start)
	for i := range out {
		a := &out[i]
		left, width := 0.0, 100.0
		if span > 0 {
			left = float64(a.StartedAt.Sub(start)) / float64(span) * 100
			width = max(float64(a.Duration)/float64(span)*100, 0.8)
		}
		a.Bar = timelineBar{Left: left, Width: min(width, 100-left), Class: outcomeClass(a.Outcome, a.Live)}
		a.Bar.W = max(a.Bar.Width*10, timelineMinW)
		a.Bar.X = min(left*10, 1000-a.Bar.W)
		switch {
		case a.Bar.X+a.Bar.W <= 600:
			a.Bar.LabelX, a.Bar.Anchor = a.Bar.X+a.Bar.W+4, "start"
		case a.Bar.X >= 300:
			a.Bar.LabelX, a.Bar.Anchor = a.Bar.X-4, "end"
		default: // a wide bar: the label goes inside it
			a.Bar.LabelX, a.Bar.Anchor, a.Bar.Inside = a.Bar.X+6, "start", true
		}
	}
	return out
}

func outcomeClass(o jobs.AttemptOutcome, live bool) string {
	switch {
	case live:
		return "live"
	case o == jobs.AttemptSucceeded || o == jobs.AttemptReused:
		return "ok"
	case o == jobs.AttemptReviewRequired:
		return "review"
	case o == jobs.AttemptFailed || o == jobs.AttemptStale || o == jobs.AttemptHung:
		return "failed"
	}
	return "retry"
}

// indentJSON pretty-prints a JSON value for the page; "" for none. The
// bidirectional controls in it (U+202A-U+202E, U+2066-U+2069, U+200E,
// U+200F, U+061C), which can only sit inside its strings, are written as
// the JSON escapes they equal (\u202e), so a payload shows them rather
// than reads reversed.
func indentJSON(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return escapeBidi(string(raw))
	}
	return escapeBidi(buf.String())
}

// escapeBidi writes the bidirectional control characters of s as \uXXXX.
func escapeBidi(s string) string {
	return bidiEscaper.Replace(s)
}

var bidiEscaper = func() *strings.Replacer {
	var pairs []string
	for _, r := range []rune{0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069} {
		pairs = append(pairs, string(r), fmt.Sprintf("\\u%04x", r))
	}
	return strings.NewReplacer(pairs...)
}()

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
