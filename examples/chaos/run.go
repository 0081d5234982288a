package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq"
	"github.com/llmq/llmq/broker/rabbitmq"
	"github.com/llmq/llmq/examples/erp"
	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/examples/internal/sample"
	"github.com/llmq/llmq/examples/internal/sqlfile"
	"github.com/llmq/llmq/examples/invoice"
	"github.com/llmq/llmq/webhook"
)

//go:embed queries.sql
var queriesSQL string

// Config sizes a chaos run. Zero values mean the defaults of `make chaos`.
type Config struct {
	// Duration is how long jobs arrive. Default 3m.
	Duration time.Duration
	// Rate is the arrivals per second, independent of completions.
	// Default 3.
	Rate float64
	// Workers is the number of worker processes; PerWorker the
	// extractions each runs at once. Defaults 3 and 4.
	Workers, PerWorker int
	// Broker carries the signal path: postgres (the memory broker of the
	// signals process), rabbitmq or kafka (kfake in this process). Default
	// rabbitmq.
	Broker string
	// Seed seeds every random choice of the run; 0 picks one (printed).
	Seed uint64
	// DatabaseURL and AMQPURL locate PostgreSQL and RabbitMQ.
	DatabaseURL, AMQPURL string
	// Scale divides the fake provider's 15s mean latency. Default 100.
	Scale float64
	// RPM and TPM are the provider's limits, which the admission pool of
	// the workers is set to. Defaults 200 and 1,000,000.
	RPM int
	TPM int64
	// DuplicateRate is the share of submissions sent again with the same
	// Idempotency-Key; ReviewRate the share of documents the provider
	// answers wrongly (REVIEW_REQUIRED). Defaults 0.1 and 0.08.
	DuplicateRate, ReviewRate float64
	// FaultEvery is the mean gap between faults once every kind has been
	// scheduled once. Default 8s.
	FaultEvery time.Duration
	// Drain bounds the wait for the run to settle after arrivals end.
	// Default 2m.
	Drain time.Duration
	// Progress is the interval of progress lines. Default 5s.
	Progress time.Duration
	// Out receives progress and the summary. Default os.Stdout.
	Out io.Writer
	// Command returns the command that runs a child process of role (the
	// controller adds its configuration to the environment). Required.
	Command func(role string) *exec.Cmd
}

func (c Config) withDefaults() (Config, error) {
	c.Duration = cmp.Or(c.Duration, 3*time.Minute)
	c.Rate = cmp.Or(c.Rate, 3)
	c.Workers = cmp.Or(c.Workers, 3)
	c.PerWorker = cmp.Or(c.PerWorker, 4)
	c.Broker = cmp.Or(c.Broker, brokerRabbitMQ)
	c.DatabaseURL = cmp.Or(c.DatabaseURL, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	c.AMQPURL = cmp.Or(c.AMQPURL, rabbitmq.DefaultURL)
	c.Scale = cmp.Or(c.Scale, 100)
	c.RPM = cmp.Or(c.RPM, 200)
	c.TPM = cmp.Or(c.TPM, 1_000_000)
	c.DuplicateRate = cmp.Or(c.DuplicateRate, 0.1)
	c.ReviewRate = cmp.Or(c.ReviewRate, 0.08)
	c.FaultEvery = cmp.Or(c.FaultEvery, 8*time.Second)
	c.Drain = cmp.Or(c.Drain, 2*time.Minute)
	c.Progress = cmp.Or(c.Progress, 5*time.Second)
	if c.Out == nil {
		c.Out = os.Stdout
	}
	for c.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		for _, x := range b {
			c.Seed = c.Seed<<8 | uint64(x)
		}
	}
	switch {
	case c.Broker != brokerPostgres && c.Broker != brokerRabbitMQ && c.Broker != brokerKafka:
		return c, fmt.Errorf("broker %q: postgres, rabbitmq or kafka", c.Broker)
	case c.Rate <= 0 || c.Workers < 1 || c.PerWorker < 1 || c.Duration <= 0:
		return c, errors.New("rate, workers, per-worker and duration must be positive")
	case c.Command == nil:
		return c, errors.New("Config.Command is required")
	}
	return c, nil
}

// The tenant the load generator submits for.
const (
	tenant      = "acme"
	tenantToken = "tok-acme"
	providerKey = "chaos-provider"
	// fallbackPool and fallbackModel are the workers' second candidate
	// for extractions (invoice.WorkerConfig.Fallback): the same fake
	// provider in Anthropic's dialect, a model with a quota of its own.
	fallbackPool  = "chaos-fallback"
	fallbackModel = "extract-fallback"
)

var supplier = invoice.Supplier{Name: "Nordwind Papier GmbH", IBAN: "DE89370400440532013000"}

// controller runs one chaos run: the in-process servers, the child
// processes, the load, the faults, and the records the checks read.
type controller struct {
	cfg     Config
	runID   string
	schema  string
	q       sqlfile.Queries
	pool    *pgxpool.Pool // the controller's own connections (never terminated)
	api     *pgxpool.Pool
	svc     *invoice.Service
	rng     *mrand.Rand // the fault schedule's choices (the injector's goroutine only)
	loadRng *mrand.Rand // the load's choices (the generator's goroutine only)
	logDir  string
	start   time.Time

	client   *http.Client // the load generator's
	provider *fakeprovider.Server
	provSrv  *httptest.Server
	apiSrv   *httptest.Server
	erp      *erp.ERP
	erpSrv   *erpServer

	brokerAddr string
	cut        *cutListener // the broker's severable path (nil for postgres)
	kafka      *kfake.Cluster
	rabbit     func() // deletes the RabbitMQ topology
	topic      string
	exchange   string

	mu         sync.Mutex
	calls      []fakeprovider.Call
	keyOwner   map[string]*child
	children   map[string]*child // by slot: w0, w1, ..., signals
	gen        map[string]int
	stopping   bool
	submitted  map[string]*submission // by Idempotency-Key
	recv       map[string]int         // deliveries per event id, all signals processes
	dups       map[string]int         // deliveries the inbox took as duplicates, per event id
	held       []string               // event ids held between commit and ack
	results    map[uuid.UUID]string   // SUCCEEDED results first seen, by job
	faults     map[string]int
	faultLog   []string
	killed     []killRecord
	stalled    []killRecord
	violations []string
	findings   []string

	killArmed  atomic.Bool
	killedCh   chan killRecord
	stallArmed atomic.Bool
	stalledCh  chan killRecord
	heldCh     chan string
}

// submission is one idempotency key of the load generator.
type submission struct {
	key, doc      string
	number        string // the invoice number, which names the job in provider calls
	review        bool   // the provider answers it wrongly: REVIEW_REQUIRED
	jobID         uuid.UUID
	accepted      bool
	duplicates    int // resubmissions answered with the same job
	duplicatesBad []string
}

type killRecord struct {
	worker string
	call   fakeprovider.Call
}

// Run runs a chaos run and returns its report; err is for a run that could
// not be carried out, violations are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	c := &controller{
		cfg: cfg, runID: hex.EncodeToString(id[:]), client: &http.Client{Timeout: 10 * time.Second},
		rng:      mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed^0x5deece66d)),        //nolint:gosec // a test schedule, not a secret
		loadRng:  mrand.New(mrand.NewPCG(cfg.Seed^0x9e3779b97f4a7c15, cfg.Seed)), //nolint:gosec // a test load, not a secret
		keyOwner: map[string]*child{}, children: map[string]*child{}, gen: map[string]int{},
		submitted: map[string]*submission{}, recv: map[string]int{}, dups: map[string]int{}, results: map[uuid.UUID]string{},
		faults: map[string]int{}, killedCh: make(chan killRecord, 1), stalledCh: make(chan killRecord, 1), heldCh: make(chan string, 1),
	}
	c.schema = "chaos_" + c.runID
	fmt.Fprintf(cfg.Out, "chaos: seed %d, schema %s, broker %s, %d worker processes x %d, %.1f jobs/s for %s, provider RPM %d\n",
		cfg.Seed, c.schema, cfg.Broker, cfg.Workers, cfg.PerWorker, cfg.Rate, cfg.Duration, cfg.RPM)
	defer c.teardown(ctx)
	if err := c.setup(ctx); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	return c.run(ctx)
}

func (c *controller) setup(ctx context.Context) error {
	var err error
	if c.logDir, err = os.MkdirTemp("", "llmq-chaos-"); err != nil {
		return err
	}
	if c.q, err = sqlfile.Load(c.schema, queriesSQL); err != nil {
		return err
	}
	ctlURL, err := withAppName(c.cfg.DatabaseURL, "chaosctl-"+c.runID, 8)
	if err != nil {
		return err
	}
	if c.pool, err = pgxpool.New(ctx, ctlURL); err != nil {
		return err
	}
	apiURL, err := withAppName(c.cfg.DatabaseURL, "chaosctl-"+c.runID+"-api", 8)
	if err != nil {
		return err
	}
	if c.api, err = pgxpool.New(ctx, apiURL); err != nil {
		return err
	}
	if _, err := llmq.Migrate(ctx, c.pool, llmq.MigrateOptions{Schema: c.schema}); err != nil {
		return err
	}
	auth := invoice.NewAuth(map[string]invoice.Credential{tenantToken: {Tenant: tenant}})
	c.svc, err = invoice.New(c.api, invoice.Config{Schema: c.schema, Auth: auth, AllowLoopback: true, WebhookSchedule: webhookSchedule()})
	if err != nil {
		return err
	}
	if err := c.svc.Migrate(ctx); err != nil {
		return err
	}
	if _, err := c.pool.Exec(ctx, c.q.Must("CreateSignals")); err != nil {
		return err
	}
	if err := c.svc.PutSupplier(ctx, tenant, supplier); err != nil {
		return err
	}
	c.topic = c.svc.Jobs.Config().EventTopic

	// Each model of the route has its own quota, the size of its pool's.
	c.provider = fakeprovider.New(fakeprovider.Config{
		Scale: c.cfg.Scale, RPM: c.cfg.RPM, TPM: int(c.cfg.TPM), Seed: c.cfg.Seed, OnCall: c.onCall,
		Models: map[string]fakeprovider.ModelConfig{
			invoice.Model: {RPM: c.cfg.RPM, TPM: int(c.cfg.TPM)},
			fallbackModel: {RPM: c.cfg.RPM, TPM: int(c.cfg.TPM)},
		},
	})
	c.provSrv = httptest.NewServer(c.provider)
	c.apiSrv = httptest.NewServer(c.svc.Handler())

	if c.erp, err = erp.New(c.pool, erp.Config{Schema: c.schema}); err != nil {
		return err
	}
	if err := c.erp.Migrate(ctx); err != nil {
		return err
	}
	if c.erpSrv, err = newERPServer(ctx, c.erp); err != nil {
		return err
	}
	_, key, err := c.svc.Webhooks.RegisterEndpoint(ctx, c.pool, webhook.EndpointParams{
		Tenant: tenant, URL: "http://" + c.erpSrv.addr + "/webhooks/" + tenant, EventTypes: []string{invoice.CompletedEvent},
	})
	if err != nil {
		return err
	}
	if err := c.erp.AddTenant(tenant, key); err != nil {
		return err
	}
	return c.setupBroker(ctx)
}

// setupBroker starts the signal path's broker behind a severable path:
// RabbitMQ through a TCP proxy, kfake on a listener of its own.
func (c *controller) setupBroker(ctx context.Context) error {
	switch c.cfg.Broker {
	case brokerRabbitMQ:
		u, err := amqpHost(c.cfg.AMQPURL)
		if err != nil {
			return err
		}
		if c.cut, err = newProxy(ctx, u.Host); err != nil {
			return err
		}
		u.Host = c.cut.Addr().String()
		c.brokerAddr = u.String()
		c.exchange = "llmq.chaos." + c.runID
		topo := rabbitmq.Topology{Exchange: c.exchange, Queues: []rabbitmq.Queue{{Name: c.exchange, Bindings: []string{c.topic}}}}
		conn, err := amqp.DialConfig(c.cfg.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			return fmt.Errorf("connecting to rabbitmq: %w", err)
		}
		withChannel := func(fn func(*amqp.Channel) error) error {
			ch, err := conn.Channel()
			if err != nil {
				return err
			}
			defer func() { _ = ch.Close() }()
			return fn(ch)
		}
		c.rabbit = func() {
			_ = withChannel(topo.Delete)
			_ = conn.Close()
		}
		return withChannel(topo.Declare)
	case brokerKafka:
		var err error
		c.kafka, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(200*time.Millisecond),
			kfake.SeedTopics(3, c.topic, c.topic+".dlq"),
			kfake.ListenFn(func(network, address string) (net.Listener, error) {
				l, err := (&net.ListenConfig{}).Listen(ctx, network, address)
				if err != nil {
					return nil, err
				}
				c.cut = newCutListener(l, nil)
				return c.cut, nil
			}))
		if err != nil {
			return err
		}
		c.brokerAddr = strings.Join(c.kafka.ListenAddrs(), ",")
		adm, err := kgo.NewClient(kgo.SeedBrokers(c.kafka.ListenAddrs()...))
		if err != nil {
			return err
		}
		defer adm.Close()
		_, err = kadm.NewClient(adm).ListTopics(ctx, c.topic)
		return err
	}
	return nil
}

func (c *controller) teardown(ctx context.Context) {
	c.stopChildren(false)
	for _, s := range []*httptest.Server{c.apiSrv, c.provSrv} {
		if s != nil {
			s.Close()
		}
	}
	if c.erpSrv != nil {
		c.erpSrv.close()
	}
	if c.kafka != nil {
		c.kafka.Close()
	}
	if c.cut != nil {
		_ = c.cut.Close()
	}
	if c.rabbit != nil {
		c.rabbit()
	}
	if c.api != nil {
		c.api.Close()
	}
	if c.pool != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, err := c.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+c.schema+" CASCADE")
		cancel()
		if err != nil {
			fmt.Fprintf(c.cfg.Out, "chaos: dropping schema %s: %v\n", c.schema, err)
		}
		c.pool.Close()
	}
	c.mu.Lock()
	ok := len(c.violations) == 0
	c.mu.Unlock()
	if ok && c.logDir != "" {
		_ = os.RemoveAll(c.logDir)
	}
}

// run drives the load and the faults, waits for the pipeline to settle and
// checks it.
func (c *controller) run(ctx context.Context) (*Report, error) {
	for i := range c.cfg.Workers {
		if err := c.startWorker(fmt.Sprintf("w%d", i)); err != nil {
			return nil, err
		}
	}
	if err := c.startSignals(); err != nil {
		return nil, err
	}
	c.start = time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	schedule := c.schedule()
	loadDone := make(chan struct{})
	faultsDone := make(chan struct{})
	go func() { c.load(runCtx, faultsDone); close(loadDone) }()
	go func() { c.inject(runCtx, schedule); close(faultsDone) }()
	var bg sync.WaitGroup
	bg.Go(func() { c.every(runCtx, 500*time.Millisecond, c.sample) })
	bg.Go(func() { c.every(runCtx, c.cfg.Progress, c.progress) })

	for _, ch := range []chan struct{}{loadDone, faultsDone} {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	settled := c.awaitSettled(runCtx)
	cancel()
	bg.Wait()
	c.stopChildren(true)
	c.sample(ctx)
	c.progress(ctx)
	return c.check(ctx, settled)
}

func (c *controller) every(ctx context.Context, d time.Duration, fn func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

// awaitSettled waits until every job is finished and every job event was
// published and handled, or the drain time is up.
func (c *controller) awaitSettled(ctx context.Context) bool {
	deadline := time.Now().Add(c.cfg.Drain)
	for time.Now().Before(deadline) {
		if c.settled(ctx) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
	return false
}

// settled reports whether every job is finished and every job event
// published and handled (false when it cannot tell).
func (c *controller) settled(ctx context.Context) bool {
	var open int64
	if err := c.pool.QueryRow(ctx, c.q.Must("Unfinished")).Scan(&open); err != nil || open > 0 {
		return false
	}
	signals, err := c.readSignals(ctx)
	if err != nil {
		return false
	}
	for _, s := range signals {
		if !s.published || s.handled == 0 {
			return false
		}
	}
	return true
}

func (c *controller) violation(format string, args ...any) {
	c.mu.Lock()
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *controller) elapsed() string {
	return time.Since(c.start).Truncate(100 * time.Millisecond).String()
}

// onCall is the fake provider's hook: the call log, and the moment a
// worker has its answer on the wire but has not recorded it.
func (c *controller) onCall(call fakeprovider.Call) {
	c.mu.Lock()
	c.calls = append(c.calls, call)
	owner := c.keyOwner[call.APIKey]
	current := owner != nil && c.children[owner.slot] == owner && !c.stopping
	c.mu.Unlock()
	// Only the slot's live process: an answer written to one that was
	// already killed must not "kill" it again and start a second
	// replacement.
	if call.Status != http.StatusOK || !current || owner.expected.Load() {
		return
	}
	switch {
	case c.killArmed.CompareAndSwap(true, false):
		owner.expected.Store(true)
		_ = owner.cmd.Process.Kill()
		c.killedCh <- killRecord{worker: owner.cfg.WorkerID, call: call}
	case c.stallArmed.CompareAndSwap(true, false):
		_ = owner.cmd.Process.Signal(syscall.SIGSTOP)
		c.stalledCh <- killRecord{worker: owner.cfg.WorkerID, call: call}
	}
}

// byNumber returns the submission of an invoice number; c.mu is held.
func (c *controller) byNumber(number string) *submission {
	for _, s := range c.submitted {
		if s.number == number {
			return s
		}
	}
	return nil
}

// child is one child process.
type child struct {
	slot     string
	cfg      childConfig
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	log      string
	done     chan struct{}
	err      error
	expected atomic.Bool // its exit was caused by the controller
	ready    atomic.Bool // it started up and runs
}

func (c *controller) startWorker(slot string) error {
	return c.startChild(slot, childConfig{
		Role: roleWorker, ProviderURL: c.provSrv.URL + "/v1", Pool: providerKey,
		FallbackURL: c.provSrv.URL, FallbackPool: fallbackPool, FallbackModel: fallbackModel,
		RPM: c.cfg.RPM, TPM: c.cfg.TPM, MaxInFlight: 4 * c.cfg.Workers * c.cfg.PerWorker, Workers: c.cfg.PerWorker,
	})
}

func (c *controller) startSignals() error {
	return c.startChild("signals", childConfig{
		Role: roleSignals, Broker: c.cfg.Broker, BrokerAddr: c.brokerAddr,
		Exchange: c.exchange, Queue: c.exchange, Group: "chaos-" + c.runID,
	})
}

// startChild starts the process of slot (its next generation) with cc.
func (c *controller) startChild(slot string, cc childConfig) error {
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return nil
	}
	gen := c.gen[slot]
	c.gen[slot]++
	c.mu.Unlock()
	name := fmt.Sprintf("%s-g%d", slot, gen)
	var err error
	cc.Schema = c.schema
	cc.WorkerID, cc.APIKey = name, "key-"+name
	if cc.DatabaseURL, err = withAppName(c.cfg.DatabaseURL, "chaos-"+c.runID+"-"+name, 8); err != nil {
		return err
	}
	env, err := json.Marshal(cc)
	if err != nil {
		return err
	}
	ch := &child{slot: slot, cfg: cc, log: filepath.Join(c.logDir, name+".log"), done: make(chan struct{})}
	logf, err := os.Create(ch.log)
	if err != nil {
		return err
	}
	ch.cmd = c.cfg.Command(cc.Role)
	ch.cmd.Env = append(os.Environ(), childEnv+"="+string(env), roleEnv+"="+cc.Role)
	ch.cmd.Stderr = logf
	if ch.stdin, err = ch.cmd.StdinPipe(); err != nil {
		_ = logf.Close()
		return err
	}
	stdout, err := ch.cmd.StdoutPipe()
	if err != nil {
		_ = logf.Close()
		return err
	}
	if err := ch.cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.mu.Lock()
	c.children[slot] = ch
	c.keyOwner[cc.APIKey] = ch
	c.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ch.ready.Store(true)
				continue
			}
			c.childLine(sc.Text())
		}
		ch.err = ch.cmd.Wait()
		_ = logf.Close()
		close(ch.done)
		c.exited(ch)
	}()
	return nil
}

// childLine reads a signals process's report.
func (c *controller) childLine(line string) {
	what, id, _ := strings.Cut(line, " ")
	switch what {
	case "recv":
		c.mu.Lock()
		c.recv[id]++
		c.mu.Unlock()
	case "dup":
		c.mu.Lock()
		c.dups[id]++
		c.mu.Unlock()
	case "held":
		select {
		case c.heldCh <- id:
		default:
		}
	}
}

// exited restarts a child that ended without the controller asking. Once
// running, that is a violation (a process of the pipeline died of a fault
// it should have ridden out); during start-up (migrations, connecting) it
// is a process failing fast, as it should, and a note.
func (c *controller) exited(ch *child) {
	if ch.expected.Load() {
		return
	}
	c.mu.Lock()
	stale := c.stopping || c.children[ch.slot] != ch
	c.mu.Unlock()
	if stale {
		return
	}
	tail, _ := os.ReadFile(ch.log)
	if len(tail) > 2000 {
		tail = tail[len(tail)-2000:]
	}
	if ch.ready.Load() {
		c.violation("%s (%s) exited by itself at %s: %v; end of its log (%s):\n%s", ch.cfg.WorkerID, ch.cfg.Role, c.elapsed(), ch.err, ch.log, tail)
	} else {
		c.mu.Lock()
		c.findings = append(c.findings, fmt.Sprintf("%s failed during start-up at %s and was restarted: %s", ch.cfg.WorkerID, c.elapsed(), strings.TrimSpace(string(tail))))
		c.mu.Unlock()
	}
	var err error
	if ch.cfg.Role == roleWorker {
		err = c.startWorker(ch.slot)
	} else {
		err = c.startSignals()
	}
	if err != nil {
		c.violation("restarting %s: %v", ch.slot, err)
	}
}

// stopChildren interrupts every child and waits for it, killing those that
// do not end within their grace. With check, a child that does not end
// cleanly (an error, a data race report, a kill) is a violation.
func (c *controller) stopChildren(check bool) {
	c.mu.Lock()
	c.stopping = true
	children := make([]*child, 0, len(c.children))
	for _, ch := range c.children {
		children = append(children, ch)
	}
	c.mu.Unlock()
	for _, ch := range children {
		ch.expected.Store(true)
		_ = ch.cmd.Process.Signal(os.Interrupt)
	}
	for _, ch := range children {
		select {
		case <-ch.done:
			if check && ch.err != nil {
				tail, _ := os.ReadFile(ch.log)
				if len(tail) > 2000 {
					tail = tail[len(tail)-2000:]
				}
				c.violation("%s (%s) did not shut down cleanly: %v; end of its log (%s):\n%s", ch.cfg.WorkerID, ch.cfg.Role, ch.err, ch.log, tail)
			}
		case <-time.After(10 * time.Second):
			_ = ch.cmd.Process.Kill()
			<-ch.done
			if check {
				c.violation("%s (%s) did not shut down within 10s of SIGINT", ch.cfg.WorkerID, ch.cfg.Role)
			}
		}
	}
}

// erpServer is the ERP's HTTP server on a loopback listener that can be
// cut: while it is down every connection is closed and new ones are closed
// as soon as they arrive, so deliveries fail as against a stopped server,
// and it comes back on the same address the endpoint is registered with.
type erpServer struct {
	addr string
	l    *cutListener
	srv  *http.Server
}

func newERPServer(ctx context.Context, h http.Handler) (*erpServer, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	e := &erpServer{addr: l.Addr().String(), l: newCutListener(l, nil), srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}}
	go func() { _ = e.srv.Serve(e.l) }()
	return e, nil
}

func (e *erpServer) down()  { e.l.Cut() }
func (e *erpServer) up()    { e.l.Restore() }
func (e *erpServer) close() { _ = e.srv.Close() }

// load is the open-loop generator: a job arrives every 1/Rate seconds
// whatever the pipeline does, each through the API with an
// Idempotency-Key, some sent twice. Arrivals last the run's duration, and
// longer if faults are still being injected: several need traffic.
func (c *controller) load(ctx context.Context, faultsDone <-chan struct{}) {
	interval := time.Duration(float64(time.Second) / c.cfg.Rate)
	t := time.NewTicker(interval)
	defer t.Stop()
	var wg sync.WaitGroup
	end := c.start.Add(c.cfg.Duration)
	arriving := func() bool {
		select {
		case <-faultsDone:
			return time.Now().Before(end)
		default:
			return true
		}
	}
	for n := 0; arriving(); n++ {
		s := &submission{key: fmt.Sprintf("chaos-%s-%d", c.runID, n), doc: fmt.Sprintf("inv-%d.txt", n), number: fmt.Sprintf("CH-%s-%05d", c.runID, n)}
		extra := ""
		if c.loadRng.Float64() < c.cfg.ReviewRate {
			s.review, extra = true, "[[fake:wrong-iban]]"
		}
		var dupAfter time.Duration
		if c.loadRng.Float64() < c.cfg.DuplicateRate {
			dupAfter = time.Duration(c.loadRng.Float64() * float64(5*time.Second))
		}
		text := sample.Invoice(supplier, s.number, n, extra)
		c.mu.Lock()
		c.submitted[s.key] = s
		c.mu.Unlock()
		wg.Go(func() { c.submit(ctx, s, text, dupAfter) })
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
		}
	}
	wg.Wait()
}

// submit uploads the document and submits its job, retrying with the same
// key until the API answers with a job; dupAfter > 0 submits it again
// that long after.
func (c *controller) submit(ctx context.Context, s *submission, text string, dupAfter time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var doc invoice.Document
	if err := c.retry(ctx, func() (bool, time.Duration, error) {
		status, body, retryAfter, err := c.call(ctx, http.MethodPut, "/documents/"+s.doc, "", []byte(text))
		if err != nil || status >= 500 || status == http.StatusTooManyRequests {
			return false, retryAfter, err
		}
		if status != http.StatusCreated && status != http.StatusOK {
			return true, 0, fmt.Errorf("PUT %s: %d %s", s.doc, status, body)
		}
		return true, 0, json.Unmarshal(body, &doc)
	}); err != nil {
		c.violation("document %s was never stored: %v", s.doc, err)
		return
	}
	req, err := json.Marshal(invoice.CreateRequest{Document: doc, Schema: invoice.SchemaV1})
	if err != nil {
		c.violation("request %s: %v", s.key, err)
		return
	}
	post := func() (uuid.UUID, error) {
		var id uuid.UUID
		err := c.retry(ctx, func() (bool, time.Duration, error) {
			status, body, retryAfter, err := c.call(ctx, http.MethodPost, "/extraction-jobs", s.key, req)
			if err != nil || status >= 500 || status == http.StatusTooManyRequests {
				return false, retryAfter, err
			}
			if status != http.StatusAccepted && status != http.StatusOK {
				return true, 0, fmt.Errorf("POST %s: %d %s", s.key, status, body)
			}
			var v invoice.JobView
			if err := json.Unmarshal(body, &v); err != nil {
				return true, 0, err
			}
			id = v.JobID
			return true, 0, nil
		})
		return id, err
	}
	id, err := post()
	if err != nil {
		c.violation("job %s was never accepted: %v", s.key, err)
		return
	}
	c.mu.Lock()
	s.jobID, s.accepted = id, true
	c.mu.Unlock()
	if dupAfter <= 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(dupAfter):
	}
	again, err := post()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		s.duplicatesBad = append(s.duplicatesBad, err.Error())
	case again != id:
		s.duplicatesBad = append(s.duplicatesBad, fmt.Sprintf("answered with job %s, not %s", again, id))
	default:
		s.duplicates++
	}
}

// retry calls fn until it says done, waiting its Retry-After (or 200ms)
// between calls, until ctx ends.
func (c *controller) retry(ctx context.Context, fn func() (done bool, retryAfter time.Duration, err error)) error {
	var last error
	for {
		done, wait, err := fn()
		if done {
			return err
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(max(wait, 200*time.Millisecond)):
		}
	}
}

// call makes one API request as the tenant.
func (c *controller) call(ctx context.Context, method, path, key string, body []byte) (int, []byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.apiSrv.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+tenantToken)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	var wait time.Duration
	if secs, perr := time.ParseDuration(resp.Header.Get("Retry-After") + "s"); perr == nil {
		wait = secs
	}
	return resp.StatusCode, b, wait, err
}

// invoiceNumber reads the invoice number out of a document's text: how a
// provider call is traced to its job.
func invoiceNumber(text string) string {
	_, rest, ok := strings.Cut(text, "Invoice number: ")
	if !ok {
		return ""
	}
	n, _, _ := strings.Cut(rest, "\n")
	return n
}

// sample reads the SUCCEEDED results and records a violation if one of
// them differs from what it was when first seen.
func (c *controller) sample(ctx context.Context) {
	rows, err := c.pool.Query(ctx, c.q.Must("SucceededResults"), invoice.Kind)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var digest string
		if rows.Scan(&id, &digest) != nil || rows.Err() != nil {
			return
		}
		c.mu.Lock()
		first, seen := c.results[id]
		if !seen {
			c.results[id] = digest
		}
		c.mu.Unlock()
		if seen && first != digest {
			c.violation("job %s: its SUCCEEDED result changed (digest %s, then %s)", id, first, digest)
		}
	}
}

func (c *controller) progress(ctx context.Context) {
	states := map[string]int64{}
	rows, err := c.pool.Query(ctx, c.q.Must("Progress"), invoice.Kind)
	if err == nil {
		for rows.Next() {
			var s string
			var n int64
			if rows.Scan(&s, &n) == nil {
				states[s] = n
			}
		}
		rows.Close()
		if rows.Err() != nil {
			return
		}
	}
	c.mu.Lock()
	submitted, accepted := len(c.submitted), 0
	for _, s := range c.submitted {
		if s.accepted {
			accepted++
		}
	}
	calls := len(c.calls)
	faults := 0
	for _, n := range c.faults {
		faults += n
	}
	c.mu.Unlock()
	fmt.Fprintf(c.cfg.Out, "%7s  submitted %d  accepted %d  ready %d  running %d  retry %d  succeeded %d  review %d  failed %d  provider calls %d  faults %d\n",
		c.elapsed(), submitted, accepted, states["READY"], states["RUNNING"], states["RETRY_SCHEDULED"], states["SUCCEEDED"],
		states["REVIEW_REQUIRED"], states["FAILED_TERMINAL"]+states["CANCELLED"], calls, faults)
}

// maxInWindow returns the most calls and tokens any window of length w
// saw, sliding over the call log by start time.
func maxInWindow(calls []fakeprovider.Call, w time.Duration) (maxCalls int, maxTokens int64) {
	sorted := make([]fakeprovider.Call, len(calls))
	copy(sorted, calls)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Start.Before(sorted[j].Start) })
	var tokens int64
	lo := 0
	for hi, call := range sorted {
		tokens += call.PromptTokens + call.CompletionTokens
		for sorted[lo].Start.Before(call.Start.Add(-w)) {
			tokens -= sorted[lo].PromptTokens + sorted[lo].CompletionTokens
			lo++
		}
		maxCalls = max(maxCalls, hi-lo+1)
		maxTokens = max(maxTokens, tokens)
	}
	return maxCalls, maxTokens
}
