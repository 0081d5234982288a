package dbtest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// textParams is the tracer of every fixture's pool. It checks each
// statement the test runs, with the arguments the code really binds, for
// what pgx's exec and simple-protocol modes need, the modes a connection
// pooler in transaction mode (PgBouncer before 1.21) leaves a host: those
// modes send every argument as text without the server's type for it
// (OID 0), so an argument must encode without that type, and to the same
// text as with it. A [16]byte id fails the first (pgx has no text form for
// it without the type); a []byte for a jsonb parameter fails the second
// (it would travel as bytea's \x… hex and be refused as JSON).
//
// The parameter types come from describing each statement once on a
// connection of the tracer's own, so the check costs the pool nothing. A
// statement that cannot be described (it has no parameters, or it will
// fail anyway) is not checked.
type textParams struct {
	config *pgx.ConnConfig

	mu       sync.Mutex
	conn     *pgx.Conn           // opened at the first statement with arguments
	params   map[string][]uint32 // parameter types by SQL; nil when not describable
	problems []string            // one line per offending argument, first seen
	seen     map[string]bool     // SQL and argument already reported
}

var (
	_ pgx.QueryTracer = (*textParams)(nil)
	_ pgx.BatchTracer = (*textParams)(nil)
)

func newTextParams(config *pgx.ConnConfig) *textParams {
	config = config.Copy()
	config.Tracer = nil
	if config.RuntimeParams == nil {
		config.RuntimeParams = map[string]string{}
	}
	config.RuntimeParams["application_name"] = "llmq-dbtest-describe"
	return &textParams{config: config, params: map[string][]uint32{}, seen: map[string]bool{}}
}

func (p *textParams) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	p.check(ctx, conn.TypeMap(), data.SQL, data.Args)
	return ctx
}

func (p *textParams) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p *textParams) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (p *textParams) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	p.check(ctx, conn.TypeMap(), data.SQL, data.Args)
}

func (p *textParams) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// check records each argument of sql that exec or simple-protocol mode
// would encode wrongly or not at all.
func (p *textParams) check(ctx context.Context, m *pgtype.Map, sql string, args []any) {
	if len(args) == 0 {
		return
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		args = args[1:]
	case pgx.QueryRewriter:
		return // named arguments and the like: the rewritten ones are not seen here
	}
	oids := p.describe(ctx, sql)
	if len(oids) != len(args) {
		return
	}
	for i, arg := range args {
		if problem := TextProblem(m, oids[i], arg); problem != "" {
			p.report(sql, i, problem)
		}
	}
}

// TextProblem says what is wrong with arg for a parameter of type oid when
// pgx sends it as text without that type, as its exec and simple-protocol
// modes do, or "" when nothing is: arg must encode without the type, and to
// the same text as with it.
func TextProblem(m *pgtype.Map, oid uint32, arg any) string {
	untyped, err := m.Encode(0, pgtype.TextFormatCode, arg, nil)
	if err != nil {
		// pgx's error prints the value, which may be long: the type says it.
		return fmt.Sprintf("%T cannot be encoded without the parameter's type (%s)", arg, typeName(m, oid))
	}
	typed, err := m.Encode(oid, pgtype.TextFormatCode, arg, nil)
	if err != nil || bytes.Equal(typed, untyped) {
		return ""
	}
	return fmt.Sprintf("%T is sent as %.40q without the parameter's type (%s), as %.40q with it", arg, untyped, typeName(m, oid), typed)
}

func typeName(m *pgtype.Map, oid uint32) string {
	if t, ok := m.TypeForOID(oid); ok {
		return t.Name
	}
	return fmt.Sprintf("oid %d", oid)
}

// describe returns the parameter types of sql, describing it once.
func (p *textParams) describe(ctx context.Context, sql string) []uint32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if oids, ok := p.params[sql]; ok {
		return oids
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, p.config)
		if err != nil {
			return nil // not cached: the next statement tries again
		}
		p.conn = conn
	}
	var oids []uint32
	if desc, err := p.conn.PgConn().Prepare(ctx, "", sql, nil); err == nil {
		oids = desc.ParamOIDs
	}
	p.params[sql] = oids
	return oids
}

func (p *textParams) report(sql string, i int, problem string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := fmt.Sprintf("%d\x00%s", i, sql)
	if p.seen[key] {
		return
	}
	p.seen[key] = true
	p.problems = append(p.problems, fmt.Sprintf("argument $%d: %s\n\tin: %s", i+1, problem, oneLine(sql)))
}

// finish closes the describing connection and fails t once per offending
// argument.
func (p *textParams) finish(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.conn.Close(ctx)
	}
	for _, problem := range p.problems {
		t.Errorf("dbtest: a statement's argument would fail behind a transaction pooler (pgx exec or simple-protocol mode): %s", problem)
	}
}

// oneLine shortens sql to its first 160 characters on one line.
func oneLine(sql string) string {
	sql = strings.Join(strings.Fields(sql), " ")
	if len(sql) > 160 {
		return sql[:160] + "…"
	}
	return sql
}
