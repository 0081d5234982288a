package console

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
)

// Whatever the query string, the filter parser either accepts it or
// refuses it with a 4xx naming a field; what it accepts round-trips
// through the query string it writes for the next page.
func FuzzParseFilter(f *testing.F) {
	for _, seed := range []string{"", "state=READY&queue=default", "state=done", "from=2026-01-02T15:04&to=2026-01-03",
		"tenant=%00", "kind=a.b-c_d", "limit=500", "limit=-1", "state=ready,running&state=CANCELLED"} {
		f.Add(seed, "")
		f.Add(seed, "acme")
	}
	f.Fuzz(func(t *testing.T, raw, scope string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if scope != "" && validate.Text(scope, true, jobs.MaxTenantLen) != "" {
			return // New refuses such a Config.Tenant
		}
		h := &Handler{cfg: Config{Tenant: scope}}
		got, err := h.parseFilter(q)
		if err != nil {
			var he *httpError
			if !errors.As(err, &he) || he.status < 400 || he.status >= 500 || !strings.Contains(he.msg, ": ") {
				t.Fatalf("refusal %v is not a 4xx naming a field", err)
			}
			return
		}
		if scope != "" && got.Tenant != scope {
			t.Fatalf("scoped to %q, the filter reads tenant %q", scope, got.Tenant)
		}
		again, err := h.parseFilter(mustQuery(t, string(got.query())))
		if err != nil {
			t.Fatalf("the next page's query %q is refused: %v", got.query(), err)
		}
		if again.Queue != got.Queue || again.Kind != got.Kind || again.Tenant != got.Tenant || again.Limit != got.Limit ||
			!again.From.Equal(got.From) || !again.To.Equal(got.To) || strings.Join(again.States, ",") != strings.Join(got.States, ",") {
			t.Fatalf("round trip changed the filter: %+v then %+v", got, again)
		}
	})
}

func mustQuery(t *testing.T, s string) url.Values {
	t.Helper()
	q, err := url.ParseQuery(s)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
