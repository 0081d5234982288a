package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/admission"
)

// poolRow is a provider pool's limits and its state when it was read.
type poolRow struct {
	admission.Pool
	InFlight        int     `json:"in_flight"`
	InFlightTokens  int64   `json:"in_flight_tokens"` // reserved by the permits in flight
	RequestLevel    float64 `json:"request_level"`    // requests grantable now
	TokenLevel      float64 `json:"token_level"`      // tokens grantable now
	CooldownSeconds float64 `json:"cooldown_seconds"`
}

func newPoolRow(s admission.PoolState) poolRow {
	return poolRow{Pool: s.Pool, InFlight: s.InFlight, InFlightTokens: s.InFlightTokens, RequestLevel: s.RequestLevel, TokenLevel: s.TokenLevel, CooldownSeconds: s.Cooldown.Seconds()}
}

func runPools(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, err := subcommand("pools", args, "list", "set")
	if err != nil {
		return err
	}
	fs, c := newFlagSet("pools "+sub, stderr)
	if sub == "list" {
		if err := parse(fs, args); err != nil {
			return err
		}
		return withLimiter(ctx, c, func(l *admission.Postgres) error {
			states, err := l.Pools(ctx)
			if err != nil {
				return err
			}
			rows := make([]poolRow, 0, len(states))
			for _, s := range states {
				rows = append(rows, newPoolRow(s))
			}
			return printPools(stdout, c.json, rows)
		})
	}
	var rpm, tpm, inFlight, inFlightTokens, requestBurst, tokenBurst, inputPrice, outputPrice, batchInputPrice, batchOutputPrice count
	fs.Var(&rpm, "rpm", "`requests` per minute the provider allows the pool")
	fs.Var(&tpm, "tpm", "`tokens` per minute the provider allows the pool")
	fs.Var(&inFlight, "in-flight", "`calls` in flight at once, across every process")
	fs.Var(&inFlightTokens, "in-flight-tokens", "`tokens` the calls in flight may reserve together: a local server's KV-cache budget (0: no limit)")
	fs.Var(&requestBurst, "request-burst", "`requests` granted at once after a quiet spell (0: RPM/60)")
	fs.Var(&tokenBurst, "token-burst", "token bucket size in `tokens`, the largest request admitted (0: TPM/10)")
	fs.Var(&inputPrice, "input-price", "price of a million input tokens, in `micro-units`, for the usage ledger")
	fs.Var(&outputPrice, "output-price", "price of a million output tokens, in `micro-units`, for the usage ledger")
	fs.Var(&batchInputPrice, "batch-input-price", "price of a million input tokens sent in a provider batch, in `micro-units` (0: half --input-price)")
	fs.Var(&batchOutputPrice, "batch-output-price", "price of a million output tokens sent in a provider batch, in `micro-units` (0: half --output-price)")
	chargeReserved := fs.Bool("charge-reserved", false, "the provider counts max_tokens: answered calls refund nothing")
	refundUncertain := fs.Bool("refund-uncertain", false, "refund the tokens of calls sent but not answered")
	create := fs.Bool("create", false, "create the pool if it does not exist (--rpm, --tpm and --in-flight then required)")
	pos, err := parseArgs(fs, args, 1, "pools set needs a pool: pools set POOL --rpm R --tpm T --in-flight N")
	if err != nil {
		return err
	}
	name, set := pos[0], setFlags(fs)
	if err := checkPool("pools set", name); err != nil {
		return err
	}
	changes := 0
	for _, f := range []string{"rpm", "tpm", "in-flight", "in-flight-tokens", "request-burst", "token-burst", "input-price", "output-price", "batch-input-price", "batch-output-price", "charge-reserved", "refund-uncertain"} {
		if set[f] {
			changes++
		}
	}
	if changes == 0 {
		return fmt.Errorf("%w: pools set %s: give at least one of --rpm, --tpm, --in-flight, --in-flight-tokens, --request-burst, --token-burst, --input-price, --output-price, --batch-input-price, --batch-output-price, --charge-reserved, --refund-uncertain", errUsage, name)
	}
	for _, f := range []struct {
		name string
		v    count
	}{{"rpm", rpm}, {"in-flight", inFlight}, {"request-burst", requestBurst}} {
		if set[f.name] && f.v > math.MaxInt32 {
			return fmt.Errorf("%w: pools set: --%s is %d; use at most %d", errUsage, f.name, f.v, math.MaxInt32)
		}
	}
	for _, f := range []struct {
		name string
		v    count
	}{{"rpm", rpm}, {"tpm", tpm}, {"in-flight", inFlight}} {
		if set[f.name] && f.v == 0 {
			return fmt.Errorf("%w: pools set: --%s must be positive", errUsage, f.name)
		}
	}
	return withLimiterTx(ctx, c, "pool "+name, func(l *admission.Postgres) error {
		state, err := l.State(ctx, name)
		var p admission.Pool
		switch {
		case errors.Is(err, admission.ErrUnknownPool) && !*create:
			return fmt.Errorf("%w %q: 'llmq pools list' shows the pools; --create makes a new one", admission.ErrUnknownPool, name)
		case errors.Is(err, admission.ErrUnknownPool):
			if !set["rpm"] || !set["tpm"] || !set["in-flight"] {
				return fmt.Errorf("%w: pools set %s --create: a new pool needs --rpm, --tpm and --in-flight", errUsage, name)
			}
			p = admission.Pool{Name: name}
		case err != nil:
			return err
		default:
			p = state.Pool
		}
		// A burst left at its default follows a new rate, as it would have
		// had the pool been set with the new rate; a burst set on purpose
		// stays.
		if set["rpm"] && !set["request-burst"] && p.RequestBurst == max(1, p.RPM/60) {
			p.RequestBurst = 0
		}
		if set["tpm"] && !set["token-burst"] && p.TokenBurst == max(1, p.TPM/10) {
			p.TokenBurst = 0
		}
		apply := []struct {
			name string
			do   func()
		}{
			{"rpm", func() { p.RPM = int(rpm) }},
			{"tpm", func() { p.TPM = int64(tpm) }},
			{"in-flight", func() { p.MaxInFlight = int(inFlight) }},
			{"in-flight-tokens", func() { p.MaxInFlightTokens = int64(inFlightTokens) }},
			{"request-burst", func() { p.RequestBurst = int(requestBurst) }},
			{"token-burst", func() { p.TokenBurst = int64(tokenBurst) }},
			{"input-price", func() { p.InputPrice = int64(inputPrice) }},
			{"output-price", func() { p.OutputPrice = int64(outputPrice) }},
			{"batch-input-price", func() { p.BatchInputPrice = int64(batchInputPrice) }},
			{"batch-output-price", func() { p.BatchOutputPrice = int64(batchOutputPrice) }},
			{"charge-reserved", func() { p.ChargeReserved = *chargeReserved }},
			{"refund-uncertain", func() { p.RefundUncertain = *refundUncertain }},
		}
		for _, a := range apply {
			if set[a.name] {
				a.do()
			}
		}
		if err := l.SetPool(ctx, p); err != nil {
			return err
		}
		state, err = l.State(ctx, name)
		if err != nil {
			return err
		}
		return printPools(stdout, c.json, []poolRow{newPoolRow(state)})
	})
}

func withLimiter(ctx context.Context, c *common, fn func(*admission.Postgres) error) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Holder names the CLI on anything it might hold; it acquires nothing.
	l, err := admission.NewPostgres(pool, admission.Config{Schema: c.schema, Holder: "llmq-cli"})
	if err != nil {
		return err
	}
	return fn(l)
}

// withLimiterTx is withLimiter inside one transaction that holds the edit
// lock of what: two operators changing the same pool at once apply their
// changes one after the other, and neither is lost.
func withLimiterTx(ctx context.Context, c *common, what string, fn func(*admission.Postgres) error) error {
	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := lockEdit(ctx, tx, c.schema, what); err != nil {
			return err
		}
		l, err := admission.NewPostgres(tx, admission.Config{Schema: c.schema, Holder: "llmq-cli"})
		if err != nil {
			return err
		}
		return fn(l)
	})
}

// lockEdit takes a transaction-scoped advisory lock on what in schema, so
// read-modify-write edits of one pool or tenant are serialised. Only the
// CLI's edits take it; the library's own writers never wait for it.
func lockEdit(ctx context.Context, tx pgx.Tx, schema, what string) error {
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", "llmq-cli-edit/"+schema+"/"+what)
	return err
}

func printPools(w io.Writer, asJSON bool, rows []poolRow) error {
	if asJSON {
		return writeJSON(w, rows)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "POOL\tRPM\tTPM\tIN FLIGHT\tTOKENS IN FLIGHT\tREQUESTS NOW\tTOKENS NOW\tCOOLDOWN\tPRICE IN/OUT\tBATCH PRICE IN/OUT\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d/%d\t%d/%s\t%.0f/%d\t%.0f/%d\t%s\t%d/%d\t%s/%s\n", r.Name, r.RPM, r.TPM, r.InFlight, r.MaxInFlight,
			r.InFlightTokens, limit(r.MaxInFlightTokens), math.Floor(r.RequestLevel), r.RequestBurst, math.Floor(r.TokenLevel), r.TokenBurst, age(r.CooldownSeconds), r.InputPrice, r.OutputPrice,
			batchPrice(r.BatchInputPrice, r.InputPrice), batchPrice(r.BatchOutputPrice, r.OutputPrice))
	}
	if len(rows) == 0 {
		fmt.Fprint(tw, "(no pools)\n")
	}
	return tw.Flush()
}

// batchPrice shows a batch price as the ledger applies it: set, or half
// the synchronous price, marked so.
func batchPrice(batch, sync int64) string {
	if batch == 0 {
		return strconv.FormatFloat(float64(sync)/2, 'f', -1, 64) + "(half)"
	}
	return strconv.FormatInt(batch, 10)
}
