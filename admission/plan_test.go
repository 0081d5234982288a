package admission_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/internal/dbtest"
)

// A limiter plans its cycle statements once per connection (CycleSetup
// forces generic plans) and keeps those plans for the connection's life,
// so a plan made while the permits table was empty runs unchanged once it
// holds thousands of rows, or thousands of dead ones between vacuums.
// Every statement that deletes permits must therefore reach them through
// the primary key whatever the table held when it was planned. The
// release's join with its ids was planned, on an empty table, as a scan of
// the whole table, and each release cycle then read every permit row, live
// or dead: a fifth of the database's CPU in a 16-process bench, and
// growing with the table (docs/performance.md). The reaping statements
// (the grant cycle's, under the pool row's lock, and the maintenance
// service's) were planned the same way once the table held expired
// permits.
func TestCyclePlansProbeThePermitsKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// The arguments as the limiter binds them: one permit id each, and
	// for the grant a second try, so that its look-up of earlier grants is
	// planned as it then runs.
	const id = "ARRAY['00000000-0000-7000-8000-000000000001'::uuid]"
	args := map[string][]string{
		"GrantGroup":       {"'p'", id, "ARRAY[500::bigint]", "ARRAY['t']", "'h'", "'2 minutes'::interval", "true"},
		"ReleaseGroup":     {"'p'", id, "ARRAY[1::smallint]", "ARRAY[1::bigint]", "ARRAY[1::bigint]", "0::smallint"},
		"ReapExpiredBatch": {"1000", "''"},
	}
	check := func(when string) {
		t.Helper()
		for name, a := range args {
			plan := dbtest.GenericPlan(t, f.pool, admission.QueryForTest(f.schema, name), a...)
			require.NotContains(t, plan, "Seq Scan on admission_permits", "%s, %s:\n%s", name, when, plan)
			require.Contains(t, plan, "admission_permits_pkey", "%s, %s:\n%s", name, when, plan)
		}
	}
	check("on an empty permits table")

	require.NoError(t, f.pg.SetPool(t.Context(), admission.Pool{Name: "p", RPM: 1e6, TPM: 1e9, MaxInFlight: 100_000}))
	// A tenth of them expired, as after holders died.
	_, err := f.pool.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s.admission_permits (id, pool, tenant, tokens, holder, expires_at)
		SELECT gen_random_uuid(), 'p', 't', 500, 'h', now() + CASE WHEN i %% 10 = 0 THEN interval '-1 minute' ELSE interval '2 minutes' END
		FROM generate_series(1, 20000) AS i`, f.schema))
	require.NoError(t, err)
	_, err = f.pool.Exec(t.Context(), "ANALYZE "+f.schema+".admission_permits")
	require.NoError(t, err)
	check("on 20,000 permits, 2,000 of them expired")
}
