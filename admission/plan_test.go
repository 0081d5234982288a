package admission_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// A limiter plans its cycle statements once per connection (CycleSetup
// forces generic plans) and keeps each plan until the connection ends or
// the table's statistics change. A plan made while admission_permits was
// empty therefore runs while it fills with live and dead permits. The
// release's join with its ids was planned, on an empty table, as a scan of
// the whole table, and each release cycle then read every permit row: a
// fifth of the database's CPU in a 16-process bench, and growing with the
// table (docs/performance.md). So every cycle statement must reach its
// permits through an index, whatever the table held when it was planned:
// never analyzed, full, or vacuumed empty (where a scan of no pages is the
// cheapest plan there is, and CycleSetup turns sequential scans off).
func TestCyclePlansProbeThePermitsKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// Planned in the cycle's transaction, after CycleSetup, as they run.
	cycleSetup := strings.ReplaceAll(admission.QueryForTest(f.schema, "CycleSetup"), "$1", "'1000ms'")
	const id = "ARRAY['00000000-0000-7000-8000-000000000001'::uuid]"
	cycle := map[string][]string{
		"GrantGroup":   {"'p'", id, "ARRAY[500::bigint]", "ARRAY['t']", "'h'", "'2 minutes'::interval", "true"},
		"ReleaseGroup": {"'p'", id, "ARRAY[1::smallint]", "ARRAY[1::bigint]", "ARRAY[1::bigint]", "0::smallint"},
		"AcquireOne":   {"'p'", "500", "'00000000-0000-7000-8000-000000000001'", "'t'", "'h'", "'2 minutes'::interval"},
		"ReleaseOne":   {"'00000000-0000-7000-8000-000000000001'", "1", "1", "1", "0::smallint"},
	}
	check := func(when string) {
		t.Helper()
		for name, args := range cycle {
			plan := dbtest.GenericPlanAfter(t, f.pool, cycleSetup, admission.QueryForTest(f.schema, name), args...)
			require.NotContains(t, plan, "Seq Scan", "%s, %s:\n%s", name, when, plan)
			require.Contains(t, plan, "admission_permits", "%s, %s:\n%s", name, when, plan)
		}
	}
	check("on a permits table never analyzed")

	// The maintenance service's batch reaping runs on its own, with the
	// plans PostgreSQL chooses; it deletes by primary key too.
	reapBatch := func(when string) {
		t.Helper()
		plan := dbtest.GenericPlan(t, f.pool, admission.QueryForTest(f.schema, "ReapExpiredBatch"), "1000", "''")
		require.NotContains(t, plan, "Seq Scan on admission_permits", "ReapExpiredBatch, %s:\n%s", when, plan)
		require.Contains(t, plan, "admission_permits_pkey", "ReapExpiredBatch, %s:\n%s", when, plan)
	}
	reapBatch("on a permits table never analyzed")

	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "p", RPM: 1e6, TPM: 1e9, MaxInFlight: 100_000}))
	// A tenth of them expired, as after holders died.
	_, err := f.pool.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s.admission_permits (id, pool, tenant, tokens, holder, expires_at)
		SELECT gen_random_uuid(), 'p', 't', 500, 'h', now() + CASE WHEN i %% 10 = 0 THEN interval '-1 minute' ELSE interval '2 minutes' END
		FROM generate_series(1, 20000) AS i`, f.schema))
	require.NoError(t, err)
	_, err = f.pool.Exec(t.Context(), "ANALYZE "+f.schema+".admission_permits")
	require.NoError(t, err)
	check("on 20,000 permits, 2,000 of them expired")
	reapBatch("on 20,000 permits, 2,000 of them expired")

	_, err = f.pool.Exec(t.Context(), "DELETE FROM "+f.schema+".admission_permits")
	require.NoError(t, err)
	_, err = f.pool.Exec(t.Context(), "VACUUM ANALYZE "+f.schema+".admission_permits")
	require.NoError(t, err)
	check("on a permits table vacuumed empty")
}
