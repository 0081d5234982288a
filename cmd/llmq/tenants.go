package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/jobs"
)

// tenantRow is a tenant's claim limits (package jobs) and acceptance quota
// (package admission) as the tenants commands print them.
type tenantRow struct {
	// Tenant is empty on the defaults' row.
	Tenant string `json:"tenant"`
	// Weight and MaxInFlight apply to the tenant: its own when OwnLimits,
	// else the defaults. MaxInFlight caps its running jobs in each queue; 0
	// means no cap.
	Weight      int  `json:"weight"`
	MaxInFlight int  `json:"max_in_flight"`
	OwnLimits   bool `json:"own_limits"`
	// Quota is the tenant's own acceptance quota (0: no limit on that
	// dimension); null when it has none and the host's configured default
	// quota applies.
	Quota *admission.TenantQuota `json:"quota"`
}

func runTenants(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand("tenants", args, "list", "set", "reset")
	if err != nil {
		return err
	}
	fs, c := newFlagSet("tenants "+sub, stderr)
	switch sub {
	case "list":
		if err := parse(fs, args); err != nil {
			return err
		}
		return withTenants(ctx, c, func(t *tenantStores) error {
			rows, err := t.list(ctx)
			if err != nil {
				return err
			}
			return printTenants(stdout, c.json, rows)
		})
	case "reset":
		pos, err := parseArgs(fs, args, 1, "tenants reset needs a tenant: tenants reset TENANT")
		if err != nil {
			return err
		}
		if pos[0] != "" { // empty is a usage error, told by reset
			if err := checkTenant("tenants reset", pos[0]); err != nil {
				return err
			}
		}
		return withTenants(ctx, c, func(t *tenantStores) error {
			row, err := t.reset(ctx, pos[0])
			if err != nil {
				return err
			}
			return printTenants(stdout, c.json, []tenantRow{row})
		})
	}
	var weight, maxInFlight, pendingJobs, pendingBytes, pendingTokens, dailyCost count
	fs.Var(&weight, "weight", fmt.Sprintf("the tenant's share `W` of each queue against other backlogged tenants, 1 to %d", jobs.MaxTenantWeight))
	fs.Var(&maxInFlight, "max-in-flight", "the most jobs `N` the tenant may run at once in each queue, across all runners (0: no cap)")
	fs.Var(&pendingJobs, "max-pending-jobs", "acceptance quota: unfinished jobs `N` (0: no limit)")
	fs.Var(&pendingBytes, "max-pending-bytes", "acceptance quota: payload `bytes` of unfinished jobs (0: no limit)")
	fs.Var(&pendingTokens, "max-pending-tokens", "acceptance quota: estimated `tokens` of unfinished jobs (0: no limit)")
	fs.Var(&dailyCost, "max-daily-cost", "acceptance quota: spend per UTC day in `micro-units` of the pools' currency (0: no limit)")
	defaults := fs.Bool("defaults", false, "set the weight and cap of tenants without their own, instead of one tenant's")
	pos, err := parseArgs(fs, args, -1, "")
	if err != nil {
		return err
	}
	set := setFlags(fs)
	for _, common := range []string{"database-url", "schema", "json", "defaults"} {
		delete(set, common)
	}
	quotaSet := set["max-pending-jobs"] || set["max-pending-bytes"] || set["max-pending-tokens"] || set["max-daily-cost"]
	tenant := ""
	switch {
	case *defaults && len(pos) > 0:
		return fmt.Errorf("%w: tenants set --defaults: unexpected argument %q; --defaults sets no one tenant", errUsage, pos[0])
	case *defaults && quotaSet:
		return fmt.Errorf("%w: tenants set --defaults: the default quota is the host's QuotaConfig.Default, not data; give only --weight and --max-in-flight", errUsage)
	case !*defaults && len(pos) != 1:
		if len(pos) > 1 {
			return fmt.Errorf("%w: tenants set: unexpected argument %q", errUsage, pos[1])
		}
		return fmt.Errorf("%w: tenants set needs a tenant: tenants set TENANT --weight W ... (or --defaults)", errUsage)
	case !*defaults:
		tenant = pos[0]
	}
	if tenant != "" {
		if err := checkTenant("tenants set", tenant); err != nil {
			return err
		}
	}
	switch {
	case tenant == "" && !*defaults:
		return fmt.Errorf("%w: tenants set: the tenant must not be empty", errUsage)
	case len(set) == 0:
		return fmt.Errorf("%w: tenants set: give at least one of --weight, --max-in-flight, --max-pending-jobs, --max-pending-bytes, --max-pending-tokens, --max-daily-cost", errUsage)
	case set["weight"] && (weight < 1 || weight > jobs.MaxTenantWeight):
		return fmt.Errorf("%w: tenants set: --weight is %d; use 1 to %d", errUsage, weight, jobs.MaxTenantWeight)
	case maxInFlight > math.MaxInt32:
		return fmt.Errorf("%w: tenants set: --max-in-flight is %d; too large", errUsage, maxInFlight)
	}
	return withTenants(ctx, c, func(t *tenantStores) error {
		row, err := t.set(ctx, tenant, func(l *jobs.TenantLimits, q *admission.TenantQuota) {
			if set["weight"] {
				l.Weight = int(weight)
			}
			if set["max-in-flight"] {
				l.MaxRunning = int(maxInFlight)
			}
			if set["max-pending-jobs"] {
				q.MaxPendingJobs = int64(pendingJobs)
			}
			if set["max-pending-bytes"] {
				q.MaxPendingBytes = int64(pendingBytes)
			}
			if set["max-pending-tokens"] {
				q.MaxPendingTokens = int64(pendingTokens)
			}
			if set["max-daily-cost"] {
				q.MaxDailyCost = int64(dailyCost)
			}
		}, set["weight"] || set["max-in-flight"], quotaSet)
		if err != nil {
			return err
		}
		return printTenants(stdout, c.json, []tenantRow{row})
	})
}

// tenantStores are the two stores holding a tenant's limits, on one pool.
type tenantStores struct {
	s      *session
	quotas *admission.Quotas
}

func withTenants(ctx context.Context, c *common, fn func(*tenantStores) error) error {
	quotas, err := admission.NewQuotas(admission.QuotaConfig{Schema: c.schema})
	if err != nil {
		return err
	}
	s, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	return fn(&tenantStores{s: s, quotas: quotas})
}

// list returns the defaults' row, then every tenant with limits or a quota
// of its own, by name.
func (t *tenantStores) list(ctx context.Context) ([]tenantRow, error) {
	limits, err := t.s.jobs.AllTenantLimits(ctx, t.s.pool)
	if err != nil {
		return nil, err
	}
	quotas, err := t.quotas.TenantQuotas(ctx, t.s.pool)
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(limits))
	for name := range quotas {
		if _, ok := limits[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	if len(names) == 0 || names[0] != "" {
		names = slices.Insert(names, 0, "") // the defaults' row was deleted by hand
	}
	defaults, ok := limits[""]
	if !ok {
		defaults = jobs.TenantLimits{Weight: 1}
	}
	rows := make([]tenantRow, 0, len(names))
	for _, name := range names {
		l, own := limits[name]
		if !own {
			l = defaults
		}
		row := tenantRow{Tenant: name, Weight: l.Weight, MaxInFlight: l.MaxRunning, OwnLimits: own || name == ""}
		if q, ok := quotas[name]; ok {
			row.Quota = &q
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// set changes tenant's limits and quota in one transaction: it reads what
// applies now (the tenant's own, else the defaults' limits and no quota),
// lets change edit it, and writes back the parts that changed. A refused
// value rolls everything back.
func (t *tenantStores) set(ctx context.Context, tenant string, change func(*jobs.TenantLimits, *admission.TenantQuota),
	limitsChanged, quotaChanged bool,
) (tenantRow, error) {
	err := pgx.BeginFunc(ctx, t.s.pool, func(tx pgx.Tx) error {
		// Concurrent edits of one tenant apply one after the other.
		if err := lockEdit(ctx, tx, t.s.jobs.Config().Schema, "tenant "+tenant); err != nil {
			return err
		}
		l, err := t.s.jobs.TenantLimitsOf(ctx, tx, tenant)
		if err != nil {
			return err
		}
		q, _, err := t.quotas.TenantQuotaOf(ctx, tx, tenant)
		if err != nil {
			return err
		}
		change(&l, &q)
		if limitsChanged {
			if err := t.s.jobs.SetTenantLimits(ctx, tx, tenant, l); err != nil {
				return err
			}
		}
		if quotaChanged {
			return t.quotas.SetTenantQuota(ctx, tx, tenant, q)
		}
		return nil
	})
	if err != nil {
		return tenantRow{}, err
	}
	return t.row(ctx, tenant)
}

// reset drops tenant's own limits and quota, in one transaction.
func (t *tenantStores) reset(ctx context.Context, tenant string) (tenantRow, error) {
	if tenant == "" {
		return tenantRow{}, fmt.Errorf("%w: tenants reset: the tenant must not be empty", errUsage)
	}
	err := pgx.BeginFunc(ctx, t.s.pool, func(tx pgx.Tx) error {
		if err := t.s.jobs.DeleteTenantLimits(ctx, tx, tenant); err != nil {
			return err
		}
		return t.quotas.DeleteTenantQuota(ctx, tx, tenant)
	})
	if err != nil {
		return tenantRow{}, err
	}
	return t.row(ctx, tenant)
}

// row reads back what applies to tenant.
func (t *tenantStores) row(ctx context.Context, tenant string) (tenantRow, error) {
	rows, err := t.list(ctx)
	if err != nil {
		return tenantRow{}, err
	}
	for _, r := range rows {
		if r.Tenant == tenant {
			return r, nil
		}
	}
	l := rows[0] // the defaults
	return tenantRow{Tenant: tenant, Weight: l.Weight, MaxInFlight: l.MaxInFlight}, nil
}

func printTenants(w io.Writer, asJSON bool, rows []tenantRow) error {
	if asJSON {
		return writeJSON(w, rows)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "TENANT\tWEIGHT\tMAX IN FLIGHT\tMAX PENDING JOBS\tMAX PENDING BYTES\tMAX PENDING TOKENS\tMAX DAILY COST\n")
	for _, r := range rows {
		name, suffix := r.Tenant, ""
		if name == "" {
			name = "(defaults)"
		} else if !r.OwnLimits {
			suffix = " (default)"
		}
		fmt.Fprintf(tw, "%s\t%d%s\t%s%s\t", name, r.Weight, suffix, limit(int64(r.MaxInFlight)), suffix)
		switch {
		case r.Quota == nil && r.Tenant == "":
			// The default quota is the host's configuration, not data.
			fmt.Fprint(tw, "(config)\t(config)\t(config)\t(config)\n")
			continue
		case r.Quota == nil:
			fmt.Fprint(tw, "default\tdefault\tdefault\tdefault\n")
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", limit(r.Quota.MaxPendingJobs), limit(r.Quota.MaxPendingBytes),
			limit(r.Quota.MaxPendingTokens), limit(r.Quota.MaxDailyCost))
	}
	return tw.Flush()
}
