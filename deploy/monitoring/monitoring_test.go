// Package monitoring_test keeps the Grafana dashboard and the Prometheus
// alert rules of this directory honest: every metric their PromQL names
// must be one the code registers, under the name the OpenTelemetry
// Prometheus exporter gives it, and every alert's runbook_url must point at
// a heading of the "Alerts and runbook" section of docs/operations.md.
//
// The registered instruments are read from the module's Go sources (go/ast:
// the string literals passed to a meter's Int64Counter, Float64Histogram,
// Int64ObservableGauge... and to the small helper closures that wrap them),
// not from a hand list, so a metric renamed or removed in the code fails
// this test until the dashboard and the rules follow. Their Prometheus names
// come from the real exporter (go.opentelemetry.io/otel/exporters/prometheus
// with its default options, as examples/internal/serve.Metrics uses it):
// each instrument is created with its kind and unit on an SDK MeterProvider
// read by the exporter, recorded once, and the exposed series names are
// gathered.
//
// The test lives in a package of its own under deploy/monitoring, beside
// the files it checks, rather than in the root package: it imports none of
// the packages that register metrics (it reads their sources), so no import
// cycle can arise, and the root package's TestMain needs PostgreSQL while
// this test needs nothing but the files.
package monitoring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"
)

const (
	moduleRoot    = "../.."
	dashboardFile = "grafana-dashboard.json"
	alertsFile    = "alerts.yml"
	operationsDoc = "../../docs/operations.md"
	runbookTitle  = "Alerts and runbook"
)

// instrument is one metric instrument the code creates.
type instrument struct {
	Name, Unit, Kind string
	Pos              string // where the code creates it
}

// instrumentKinds are the metric.Meter methods that create an instrument.
var instrumentKinds = map[string]bool{
	"Int64Counter": true, "Float64Counter": true,
	"Int64UpDownCounter": true, "Float64UpDownCounter": true,
	"Int64Histogram": true, "Float64Histogram": true,
	"Int64Gauge": true, "Float64Gauge": true,
	"Int64ObservableCounter": true, "Float64ObservableCounter": true,
	"Int64ObservableUpDownCounter": true, "Float64ObservableUpDownCounter": true,
	"Int64ObservableGauge": true, "Float64ObservableGauge": true,
}

// skipDir names the directories whose code is not the library's: the
// examples register no llmq metric of their own, and testdata is not code.
func skipDir(rel string, d fs.DirEntry) bool {
	name := d.Name()
	return rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
		name == "testdata" || name == "vendor" || name == "node_modules" || rel == "examples")
}

// registeredInstruments parses every non-test Go file of the module and
// returns the instruments created there. A name or unit it cannot resolve
// to a string literal is an error: the test must be taught the new shape
// rather than miss a metric.
func registeredInstruments(t *testing.T) []instrument {
	t.Helper()
	fset := token.NewFileSet()
	var out []instrument
	var problems []string
	err := filepath.WalkDir(moduleRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(moduleRoot, path)
		if d.IsDir() {
			if skipDir(filepath.ToSlash(rel), d) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		found, bad := fileInstruments(fset, f)
		out = append(out, found...)
		problems = append(problems, bad...)
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, problems, "instrument constructors whose name or unit is not a string literal")
	return out
}

// fileInstruments finds the instruments created in f. A constructor call
// inside a function literal bound to a variable (lease's counter and
// histogram helpers) whose name or unit is one of the literal's parameters
// is resolved at each call of that variable in the file.
func fileInstruments(fset *token.FileSet, f *ast.File) (found []instrument, problems []string) {
	bound := map[*ast.FuncLit]string{} // function literal -> the variable it is assigned to
	calls := map[string][]*ast.CallExpr{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, rhs := range n.Rhs {
				if lit, ok := rhs.(*ast.FuncLit); ok && i < len(n.Lhs) {
					if id, ok := n.Lhs[i].(*ast.Ident); ok {
						bound[lit] = id.Name
					}
				}
			}
		case *ast.ValueSpec:
			for i, v := range n.Values {
				if lit, ok := v.(*ast.FuncLit); ok && i < len(n.Names) {
					bound[lit] = n.Names[i].Name
				}
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok {
				calls[id.Name] = append(calls[id.Name], n)
			}
		}
		return true
	})

	var stack []ast.Node
	ast.Inspect(f, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !instrumentKinds[sel.Sel.Name] || len(call.Args) == 0 {
			return true
		}
		kind, pos := sel.Sel.Name, fset.Position(call.Pos()).String()
		nameExpr, unitExpr := call.Args[0], unitOption(call.Args[1:])
		if name, ok := literal(nameExpr, nil); ok {
			if unit, ok := literal(unitExpr, nil); ok {
				found = append(found, instrument{Name: name, Unit: unit, Kind: kind, Pos: pos})
				return true
			}
		}
		// Resolve through the innermost enclosing function literal's
		// parameters, at every call of the variable it is bound to.
		var lit *ast.FuncLit
		for i := len(stack) - 1; i >= 0 && lit == nil; i-- {
			lit, _ = stack[i].(*ast.FuncLit)
		}
		if lit == nil || bound[lit] == "" || len(calls[bound[lit]]) == 0 {
			problems = append(problems, pos)
			return true
		}
		var params []string
		for _, field := range lit.Type.Params.List {
			for _, id := range field.Names {
				params = append(params, id.Name)
			}
		}
		for _, site := range calls[bound[lit]] {
			env := map[string]ast.Expr{}
			for i, p := range params {
				if i < len(site.Args) {
					env[p] = site.Args[i]
				}
			}
			name, okName := literal(nameExpr, env)
			unit, okUnit := literal(unitExpr, env)
			if !okName || !okUnit {
				problems = append(problems, fset.Position(site.Pos()).String())
				continue
			}
			found = append(found, instrument{Name: name, Unit: unit, Kind: kind, Pos: fset.Position(site.Pos()).String()})
		}
		return true
	})
	return found, problems
}

// unitOption returns the argument of the metric.WithUnit option among
// opts, or nil when there is none (no unit).
func unitOption(opts []ast.Expr) ast.Expr {
	for _, o := range opts {
		call, ok := o.(*ast.CallExpr)
		if !ok || len(call.Args) != 1 {
			continue
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WithUnit" {
			return call.Args[0]
		}
	}
	return nil
}

// literal evaluates e as a string literal, or a parameter bound in env to
// one. A nil e is the empty string (no unit option).
func literal(e ast.Expr, env map[string]ast.Expr) (string, bool) {
	switch e := e.(type) {
	case nil:
		return "", true
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		if v, ok := env[e.Name]; ok {
			return literal(v, nil)
		}
	}
	return "", false
}

// exposed maps each series name the Prometheus exporter exposes for the
// instruments (a histogram's _bucket, _sum and _count, a counter's _total)
// to the OpenTelemetry instrument it comes from.
func exposed(t *testing.T, instruments []instrument) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, in := range instruments {
		for _, series := range exposedNames(t, in) {
			out[series] = in.Name
		}
	}
	return out
}

// exposedNames creates in on a MeterProvider read by the Prometheus
// exporter with its default options, records one value and returns the
// series names gathered.
func exposedNames(t *testing.T, in instrument) []string {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { require.NoError(t, mp.Shutdown(t.Context())) }()
	m := mp.Meter("github.com/llmq/llmq/deploy/monitoring")
	ctx, unit := t.Context(), metric.WithUnit(in.Unit)
	switch in.Kind {
	case "Int64Counter":
		c, err := m.Int64Counter(in.Name, unit)
		require.NoError(t, err)
		c.Add(ctx, 1)
	case "Float64Counter":
		c, err := m.Float64Counter(in.Name, unit)
		require.NoError(t, err)
		c.Add(ctx, 1)
	case "Int64UpDownCounter":
		c, err := m.Int64UpDownCounter(in.Name, unit)
		require.NoError(t, err)
		c.Add(ctx, 1)
	case "Float64UpDownCounter":
		c, err := m.Float64UpDownCounter(in.Name, unit)
		require.NoError(t, err)
		c.Add(ctx, 1)
	case "Int64Histogram":
		h, err := m.Int64Histogram(in.Name, unit)
		require.NoError(t, err)
		h.Record(ctx, 1)
	case "Float64Histogram":
		h, err := m.Float64Histogram(in.Name, unit)
		require.NoError(t, err)
		h.Record(ctx, 1)
	case "Int64Gauge":
		g, err := m.Int64Gauge(in.Name, unit)
		require.NoError(t, err)
		g.Record(ctx, 1)
	case "Float64Gauge":
		g, err := m.Float64Gauge(in.Name, unit)
		require.NoError(t, err)
		g.Record(ctx, 1)
	case "Int64ObservableCounter":
		_, err := m.Int64ObservableCounter(in.Name, unit, metric.WithInt64Callback(observeInt))
		require.NoError(t, err)
	case "Float64ObservableCounter":
		_, err := m.Float64ObservableCounter(in.Name, unit, metric.WithFloat64Callback(observeFloat))
		require.NoError(t, err)
	case "Int64ObservableUpDownCounter":
		_, err := m.Int64ObservableUpDownCounter(in.Name, unit, metric.WithInt64Callback(observeInt))
		require.NoError(t, err)
	case "Float64ObservableUpDownCounter":
		_, err := m.Float64ObservableUpDownCounter(in.Name, unit, metric.WithFloat64Callback(observeFloat))
		require.NoError(t, err)
	case "Int64ObservableGauge":
		_, err := m.Int64ObservableGauge(in.Name, unit, metric.WithInt64Callback(observeInt))
		require.NoError(t, err)
	case "Float64ObservableGauge":
		_, err := m.Float64ObservableGauge(in.Name, unit, metric.WithFloat64Callback(observeFloat))
		require.NoError(t, err)
	default:
		t.Fatalf("%s: instrument kind %s has no case here", in.Pos, in.Kind)
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, f := range families {
		if f.GetName() == "target_info" || f.GetName() == "otel_scope_info" {
			continue
		}
		switch f.GetType().String() {
		case "HISTOGRAM":
			names = append(names, f.GetName()+"_bucket", f.GetName()+"_sum", f.GetName()+"_count")
		case "SUMMARY":
			names = append(names, f.GetName(), f.GetName()+"_sum", f.GetName()+"_count")
		default:
			names = append(names, f.GetName())
		}
	}
	require.NotEmpty(t, names, "%s: the exporter exposed nothing for %s", in.Pos, in.Name)
	return names
}

func observeInt(_ context.Context, o metric.Int64Observer) error {
	o.Observe(1)
	return nil
}

func observeFloat(_ context.Context, o metric.Float64Observer) error {
	o.Observe(1)
	return nil
}

// metricRef matches a metric name in PromQL. Label values the rules and
// panels use never start with "llmq_".
var metricRef = regexp.MustCompile(`\bllmq_[a-z0-9_]+`)

// baseName strips the series suffix Prometheus adds to a metric family.
func baseName(series string) string {
	for _, s := range []string{"_bucket", "_sum", "_count", "_total"} {
		if b, ok := strings.CutSuffix(series, s); ok {
			return b
		}
	}
	return series
}

// dashboardExprs returns the PromQL of a Grafana dashboard: every string
// under a key "expr", "query" or "definition" (panel targets and template
// variables), wherever it is nested.
func dashboardExprs(data []byte) ([]string, error) {
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", dashboardFile, err)
	}
	var out []string
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				walk(k, c)
			}
		case []any:
			for _, c := range v {
				walk(key, c)
			}
		case string:
			if key == "expr" || key == "query" || key == "definition" {
				out = append(out, v)
			}
		}
	}
	walk("", doc)
	return out, nil
}

// rules is a Prometheus rule file.
type rules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// check returns every way the dashboard, the rules and the runbook
// disagree with the code: a metric name the exporter does not expose for
// any instrument the code registers, an alert without its severity,
// summary, for or runbook_url, and a runbook_url whose anchor is no heading
// of the runbook section.
func check(exposedSeries map[string]string, dashboard, alerts, doc []byte) []string {
	var problems []string
	bases := map[string]bool{}
	for s := range exposedSeries {
		bases[baseName(s)] = true
	}
	checkExpr := func(where, expr string) {
		for _, ref := range metricRef.FindAllString(expr, -1) {
			switch {
			case !bases[baseName(ref)]:
				problems = append(problems, fmt.Sprintf("%s: %s (metric %s) is no metric the code registers", where, ref, baseName(ref)))
			case exposedSeries[ref] == "":
				problems = append(problems, fmt.Sprintf("%s: %s has the wrong suffix for its metric's type", where, ref))
			}
		}
	}

	exprs, err := dashboardExprs(dashboard)
	if err != nil {
		return append(problems, err.Error())
	}
	if len(exprs) == 0 {
		problems = append(problems, dashboardFile+": no PromQL found")
	}
	for _, e := range exprs {
		checkExpr(dashboardFile, e)
	}

	var rf rules
	if err := yaml.Unmarshal(alerts, &rf); err != nil {
		return append(problems, fmt.Sprintf("%s: %v", alertsFile, err))
	}
	anchors := runbookAnchors(doc)
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			n++
			where := fmt.Sprintf("%s: %s", alertsFile, cmpOr(r.Alert, r.Record))
			checkExpr(where, r.Expr)
			if r.Alert == "" {
				continue
			}
			if r.For == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				problems = append(problems, where+": needs for, labels.severity and annotations.summary")
			}
			url := r.Annotations["runbook_url"]
			_, anchor, ok := strings.Cut(url, "docs/operations.md#")
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: runbook_url %q does not point into docs/operations.md", where, url))
			case !anchors[anchor]:
				problems = append(problems, fmt.Sprintf("%s: runbook_url anchor #%s is no heading of the %q section of docs/operations.md", where, anchor, runbookTitle))
			}
		}
	}
	if n == 0 {
		problems = append(problems, alertsFile+": no rules")
	}
	return problems
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// runbookAnchors returns the GitHub anchors of the headings of the
// runbook section of a markdown document: from its "## Alerts and
// runbook" heading to the next heading of that level or higher.
func runbookAnchors(doc []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{} // GitHub numbers repeated anchors: x, x-1, x-2
	in, fence := false, false
	for line := range strings.SplitSeq(string(doc), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		level, title := len(m[1]), strings.TrimSpace(m[2])
		anchor := githubAnchor(title)
		if k := seen[anchor]; k > 0 {
			seen[anchor]++
			anchor = fmt.Sprintf("%s-%d", anchor, k)
		} else {
			seen[anchor] = 1
		}
		switch {
		case level <= 2 && title == runbookTitle:
			in = true
		case level <= 2:
			in = false
		}
		if in {
			out[anchor] = true
		}
	}
	return out
}

var heading = regexp.MustCompile(`^(#{1,6}) (.*)$`)

// githubAnchor is the id GitHub gives a heading: lower case, spaces to
// hyphens, punctuation other than hyphens and underscores dropped.
func githubAnchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// The code registers the instruments docs/operations.md lists, and the
// exporter names them as the docs' mapping says.
func TestRegisteredMetrics(t *testing.T) {
	t.Parallel()
	ins := registeredInstruments(t)
	names := make([]string, 0, len(ins))
	for _, in := range ins {
		names = append(names, in.Name)
	}
	for _, want := range []string{"llmq.jobs", "llmq.jobs.oldest_runnable_age", "llmq.attempts", "llmq.route.calls", "llmq.outbox.lag"} {
		require.Contains(t, names, want, "the source scan lost an instrument")
	}
	series := exposed(t, ins)
	for s, want := range map[string]string{
		"llmq_jobs":                             "llmq.jobs", // gauge, {job}: no suffix
		"llmq_jobs_oldest_runnable_age_seconds": "llmq.jobs.oldest_runnable_age",
		"llmq_attempts_total":                   "llmq.attempts", // counter: _total
		"llmq_attempt_duration_seconds_bucket":  "llmq.attempt.duration",
		"llmq_outbox_relay_active":              "llmq.outbox.relay.active",
	} {
		require.Equal(t, want, series[s], "exposed series %s", s)
	}
	// Every instrument is in the docs' metrics table.
	doc := string(readFile(t, operationsDoc))
	for _, n := range names {
		short := n[strings.LastIndex(n, "."):]
		require.True(t, strings.Contains(doc, "`"+n+"`") || strings.Contains(doc, "`"+short+"`"),
			"%s is missing from the metrics table of docs/operations.md", n)
	}
	if testing.Verbose() {
		list := make([]string, 0, len(series))
		for s, n := range series {
			list = append(list, n+" -> "+s)
		}
		sort.Strings(list)
		t.Log("\n" + strings.Join(list, "\n"))
	}
}

// The dashboard and the alerts name only metrics the code registers, and
// each alert's runbook is a heading of the runbook section; a fake name, a
// wrong suffix or a missing anchor fails.
func TestDashboardAndAlertsMatchCode(t *testing.T) {
	t.Parallel()
	series := exposed(t, registeredInstruments(t))
	dashboard, alerts, doc := readFile(t, dashboardFile), readFile(t, alertsFile), readFile(t, operationsDoc)

	fakeAlert := func(expr string) []byte {
		return append(slices.Clone(alerts), []byte(`
  - name: fake
    rules:
      - alert: Fake
        expr: `+expr+`
        for: 5m
        labels: {severity: warning}
        annotations:
          summary: fake
          runbook_url: https://github.com/llmq/llmq/blob/main/docs/operations.md#llmqqueuebacklogold
`)...)
	}
	fakePanel := func(expr string) []byte {
		var d map[string]any
		require.NoError(t, json.Unmarshal(dashboard, &d))
		panels, ok := d["panels"].([]any)
		require.True(t, ok, "the dashboard has a panels list")
		d["panels"] = append(panels, map[string]any{
			"type": "timeseries", "title": "fake", "targets": []any{map[string]any{"expr": expr}}})
		b, err := json.Marshal(d)
		require.NoError(t, err)
		return b
	}
	badRunbook := strings.Replace(string(alerts), "operations.md#llmqqueuebacklogold", "operations.md#no-such-heading", 1)

	for _, tc := range []struct {
		name                   string
		dashboard, alerts, doc []byte
		wantProblem            string // "" for none
	}{
		{"the files as they are", dashboard, alerts, doc, ""},
		{"an alert on a fake metric", dashboard, fakeAlert("rate(llmq_fake_metric_total[5m]) > 0"), doc, "llmq_fake_metric_total (metric llmq_fake_metric)"},
		{"a panel on a fake metric", fakePanel("sum(llmq_queue_depth)"), alerts, doc, "llmq_queue_depth (metric llmq_queue_depth)"},
		{"a counter suffix on a gauge", fakePanel("llmq_jobs_total"), alerts, doc, "llmq_jobs_total has the wrong suffix"},
		{"a histogram without its suffix", dashboard, fakeAlert("llmq_attempt_duration_seconds > 1"), doc, "llmq_attempt_duration_seconds has the wrong suffix"},
		{"a runbook anchor that is no heading", dashboard, []byte(badRunbook), doc, "#no-such-heading is no heading"},
		{"a runbook section that is missing", dashboard, alerts, []byte(strings.Replace(string(doc), "## "+runbookTitle, "## Something else", 1)), "is no heading"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			problems := check(series, tc.dashboard, tc.alerts, tc.doc)
			if tc.wantProblem == "" {
				require.Empty(t, problems)
				return
			}
			require.NotEmpty(t, problems)
			require.Contains(t, strings.Join(problems, "\n"), tc.wantProblem)
		})
	}
}
