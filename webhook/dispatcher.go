package webhook

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/retry"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/outbox"
)

// Dispatcher defaults.
const (
	DefaultBreakerThreshold   = 5
	DefaultBreakerCooldown    = time.Minute
	DefaultAuthAlertThreshold = 3
	DefaultAuthSlowdown       = 4
	DefaultMaxConns           = 2
	// MinDefer is the shortest time a delivery is put off by an open
	// breaker, so that deferred jobs do not spin.
	MinDefer = 100 * time.Millisecond
	// AlertAuthFailing is the type of the alert event written when an
	// endpoint keeps answering 401 or 403.
	AlertAuthFailing = "webhook.endpoint.auth_failing"
	// AlertDisabled is the type of the event written when an endpoint
	// answered 410 Gone and was disabled.
	AlertDisabled = "webhook.endpoint.disabled"
)

// Error classes of delivery attempts, in attempt records.
const (
	ClassHTTP        = "http_status"       // the endpoint answered with a failure status
	ClassNetwork     = "network"           // no response: timeout, refused, reset, TLS
	ClassForbidden   = "forbidden_address" // the URL's address is not public
	ClassAuth        = "auth"              // 401 or 403
	ClassGone        = "gone"              // 410: the endpoint was disabled
	ClassInterrupted = "interrupted"       // the attempt's own context ended (shutdown, lost lease) before a response
)

// DispatcherConfig configures a Dispatcher.
type DispatcherConfig struct {
	// Client sends the requests. Required.
	Client *Client
	// BreakerThreshold is how many consecutive failures (no response, 408,
	// 5xx) open an endpoint's breaker. Default 5.
	BreakerThreshold int
	// BreakerCooldown is how long an open breaker defers deliveries before
	// one probe may try. Default 1 minute.
	BreakerCooldown time.Duration
	// AuthAlertThreshold is how many consecutive 401/403 answers raise an
	// AlertAuthFailing event. Default 3.
	AuthAlertThreshold int
	// AuthSlowdown multiplies the schedule's delay after a 401/403, so that
	// a misconfigured receiver is retried slowly rather than given up on;
	// the slowed delay is at most llmqtype.MaxRetryAfter (24h), so the
	// default schedule's 10h steps wait 24h, not 40h. Default 4.
	AuthSlowdown int
	// Worker names this dispatcher in attempt records. Default: the job's
	// lease owner (the runner's WorkerID).
	Worker string
	// MaxConns is the most database connections the dispatcher uses at
	// once, however many deliveries the runner has in flight: loading a
	// delivery, asking the breaker and recording an attempt each take one
	// for a few round trips and wait for a turn beyond this. No connection
	// is held while a request is out. Default 2.
	MaxConns int
	// Logger receives warnings and errors (an attempt that could not be
	// recorded). Default: slog.Default(), as it is when NewDispatcher runs.
	Logger *slog.Logger
	// MeterProvider receives the dispatcher's metrics (see the package
	// documentation). Nil means none.
	MeterProvider metric.MeterProvider
	// GaugeRefresh is the longest the breaker gauge reuses one reading of
	// the database. Default 15s.
	GaugeRefresh time.Duration
	// TracerProvider receives a span per delivery attempt, a child of the
	// runner's attempt span. Nil means none.
	TracerProvider trace.TracerProvider
}

// Dispatcher is the lease.Handler of Kind: each call is one signed HTTP
// attempt of one delivery.
type Dispatcher struct {
	store *Store
	db    DBTX
	cfg   DispatcherConfig
	obs   *dispatcherInstruments
	// conns holds a token per database connection in use (MaxConns).
	conns chan struct{}
}

// NewDispatcher validates cfg and returns the handler for Kind, reading and
// recording through db (a pool).
func (s *Store) NewDispatcher(db DBTX, cfg DispatcherConfig) (*Dispatcher, error) {
	invalid := func(field, problem string) error {
		return &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: field, Problem: problem}
	}
	switch {
	case db == nil:
		return nil, invalid("db", "is required")
	case cfg.Client == nil:
		return nil, invalid("Client", "is required")
	case cfg.BreakerThreshold < 0, cfg.BreakerCooldown < 0, cfg.AuthAlertThreshold < 0, cfg.AuthSlowdown < 0:
		return nil, invalid("DispatcherConfig", "thresholds, cool-down and slowdown must not be negative")
	case cfg.GaugeRefresh < 0:
		return nil, invalid("GaugeRefresh", "must not be negative")
	case cfg.MaxConns < 0:
		return nil, invalid("MaxConns", "must not be negative")
	}
	cfg.GaugeRefresh = cmp.Or(cfg.GaugeRefresh, DefaultGaugeRefresh)
	cfg.BreakerThreshold = cmp.Or(cfg.BreakerThreshold, DefaultBreakerThreshold)
	cfg.BreakerCooldown = cmp.Or(cfg.BreakerCooldown, DefaultBreakerCooldown)
	cfg.AuthAlertThreshold = cmp.Or(cfg.AuthAlertThreshold, DefaultAuthAlertThreshold)
	cfg.AuthSlowdown = cmp.Or(cfg.AuthSlowdown, DefaultAuthSlowdown)
	cfg.MaxConns = cmp.Or(cfg.MaxConns, DefaultMaxConns)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Dispatcher{store: s, db: db, cfg: cfg, conns: make(chan struct{}, cfg.MaxConns)}
	obs, err := s.newDispatcherInstruments(d.withConn, db, cfg)
	if err != nil {
		return nil, fmt.Errorf("webhook: dispatcher instruments: %w", err)
	}
	d.obs = obs
	return d, nil
}

// withConn runs fn, which uses one database connection, once fewer than
// MaxConns of the dispatcher's are in use.
func (d *Dispatcher) withConn(ctx context.Context, fn func() error) error {
	select {
	case d.conns <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("webhook: waiting for a database connection: %w", context.Cause(ctx))
	}
	defer func() { <-d.conns }()
	return fn()
}

type attemptTarget struct {
	endpointID  uuid.UUID
	body        []byte
	url         string
	scheme      Scheme
	sendKeyIDs  bool
	status      Status
	breaker     BreakerState
	breakerTill *time.Time
	keys        []Key
}

// Work implements lease.Handler: one attempt of the job's delivery.
func (d *Dispatcher) Work(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
	var p deliveryPayload
	if err := json.Unmarshal(job.Payload, &p); err != nil {
		return nil, jobs.Permanent(fmt.Errorf("webhook: delivery payload: %w", err))
	}
	t, err := d.load(ctx, job.Tenant, p)
	if err != nil {
		return nil, d.onSchedule(job, err)
	}
	p.EndpointID = t.endpointID
	if t.status != StatusEnabled {
		return nil, jobs.Permanent(fmt.Errorf("%w: %s", ErrEndpointDisabled, p.EndpointID))
	}
	ctx, span := d.startSpan(ctx, job, p)
	if t.breaker != BreakerClosed {
		if wait, admitted, err := d.admit(ctx, job.Tenant, p); err != nil {
			span.End()
			return nil, d.onSchedule(job, err)
		} else if !admitted {
			d.report(ctx, span, verdict{outcome: "deferred"}, nil, 0)
			return nil, jobs.Snooze(max(wait, MinDefer))
		}
	}
	if len(t.keys) == 0 {
		span.End()
		return nil, jobs.Permanent(fmt.Errorf("webhook: endpoint %s has no signing key", p.EndpointID))
	}

	started := time.Now()
	header := Sign(t.scheme, t.keys, p.DeliveryID.String(), started, t.body, t.sendKeyIDs)
	resp, sendErr := d.cfg.Client.Post(ctx, t.url, header, t.body)
	latency := time.Since(started)
	v := d.classify(ctx, job, resp, sendErr)
	d.report(context.WithoutCancel(ctx), span, v, resp, latency)

	rec := attemptRecord{p: p, job: job, url: t.url, started: started, latency: latency, header: header, keys: t.keys, resp: resp, verdict: v}
	// Record even if the attempt's context ended (lease lost, shutdown): the
	// request may have reached the endpoint, and its history must say so.
	recordCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := d.record(recordCtx, rec); err != nil {
		d.cfg.Logger.Error("webhook: recording an attempt", "delivery", p.DeliveryID, "err", err)
		if v.err == nil {
			// Delivered but not recorded: retry; the receiver deduplicates
			// on the delivery id.
			return nil, d.onSchedule(job, fmt.Errorf("webhook: recording the attempt: %w", err))
		}
	}
	if v.err != nil {
		return nil, v.err
	}
	return json.Marshal(map[string]any{"delivery_id": p.DeliveryID, "status": resp.Status})
}

// onSchedule retries a failure of our own (the database, not the endpoint)
// on the delivery schedule, since the runner's backoff for Kind is none;
// permanent failures stay permanent.
func (d *Dispatcher) onSchedule(job *jobs.Job, err error) error {
	if _, ok := errors.AsType[*jobs.PermanentError](err); ok {
		return err
	}
	return jobs.RetryAfter(err, d.store.delay(job.Attempt))
}

func (d *Dispatcher) load(ctx context.Context, tenant string, p deliveryPayload) (*attemptTarget, error) {
	var r targetRow
	err := d.withConn(ctx, func() error {
		return d.db.QueryRow(ctx, d.store.sql.loadAttempt, tenant, p.DeliveryID).Scan(r.dest()...)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, jobs.Permanent(fmt.Errorf("webhook: delivery %s: %w", p.DeliveryID, ErrNotFound))
	}
	if err != nil {
		return nil, fmt.Errorf("webhook: loading delivery %s: %w", p.DeliveryID, err)
	}
	t, keyIDs, secrets, sealed := r.t, r.keyIDs, r.secrets, r.sealed
	t.scheme, t.status, t.breaker = Scheme(r.scheme), Status(r.status), BreakerState(r.breaker)
	for i := range keyIDs {
		secret, err := d.store.openKey(t.endpointID, keyIDs[i], secrets[i], sealed[i])
		if err != nil {
			// A configuration problem of this host, not of the delivery:
			// it is retried on its schedule.
			return nil, fmt.Errorf("webhook: delivery %s: %w", p.DeliveryID, err)
		}
		t.keys = append(t.keys, Key{ID: keyIDs[i], Secret: secret})
	}
	return &t, nil
}

// admit asks the shared breaker whether this attempt may go: it may when the
// breaker is closed, or when this dispatcher becomes the half-open probe.
func (d *Dispatcher) admit(ctx context.Context, tenant string, p deliveryPayload) (time.Duration, bool, error) {
	var state string
	var until *time.Time
	var admitted bool
	var now time.Time
	probe := d.cfg.Client.cfg.AttemptTimeout + time.Second
	err := d.withConn(ctx, func() error {
		return d.db.QueryRow(ctx, d.store.sql.breakerAdmit, tenant, p.EndpointID, probe.Milliseconds()).Scan(&state, &until, &admitted, &now)
	})
	if err != nil {
		return 0, false, fmt.Errorf("webhook: breaker of %s: %w", p.EndpointID, err)
	}
	if admitted || BreakerState(state) == BreakerClosed {
		return 0, true, nil
	}
	return dbsql.Deref(until).Sub(now), false, nil
}

// verdict is what an attempt's outcome means.
type verdict struct {
	outcome     string // delivered | retry | failed | disabled
	class       string
	message     string
	err         error // what Work returns; nil when delivered
	breakerFail bool  // counts towards opening the breaker
	auth        bool  // a 401/403
	gone        bool  // a 410
}

func (d *Dispatcher) classify(ctx context.Context, job *jobs.Job, resp *Response, err error) verdict {
	delay := d.store.delay(job.Attempt)
	switch {
	case errors.Is(err, ErrForbiddenAddress), errors.Is(err, ErrInvalidURL), errors.Is(err, ErrInsecureURL):
		return verdict{outcome: "failed", class: ClassForbidden, message: err.Error(), err: jobs.Permanent(err)}
	case err != nil && resp == nil && ctx.Err() != nil && !errors.Is(context.Cause(ctx), lease.ErrAttemptTimeout):
		// Our own attempt ended (shutdown, lost lease, cancellation): no
		// verdict on the endpoint, so the breaker is untouched. The runner's
		// attempt timeout, like the client's, is the endpoint being slow.
		cause := context.Cause(ctx)
		return verdict{outcome: "retry", class: ClassInterrupted, message: cause.Error(), err: jobs.RetryAfter(cause, delay)}
	case err != nil && resp == nil:
		return verdict{outcome: "retry", class: ClassNetwork, message: err.Error(), breakerFail: true,
			err: jobs.RetryAfter(err, delay)}
	}
	status := resp.Status
	failure := fmt.Errorf("webhook: endpoint answered %d %s", status, http.StatusText(status))
	switch {
	case status >= 200 && status < 300:
		if err != nil { // the status arrived; a broken body does not undo the delivery
			return verdict{outcome: "delivered", message: err.Error()}
		}
		return verdict{outcome: "delivered"}
	case status == http.StatusGone:
		return verdict{outcome: "disabled", class: ClassGone, message: failure.Error(), gone: true,
			err: jobs.Permanent(fmt.Errorf("%w: %w", ErrEndpointDisabled, failure))}
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return verdict{outcome: "retry", class: ClassAuth, message: failure.Error(), auth: true,
			err: jobs.RetryAfter(failure, delay*time.Duration(d.cfg.AuthSlowdown))}
	case status == http.StatusTooManyRequests || status == http.StatusTooEarly:
		return verdict{outcome: "retry", class: ClassHTTP, message: failure.Error(), err: jobs.RetryAfter(failure, max(delay, retryAfter(resp)))}
	case status == http.StatusRequestTimeout || status >= 500:
		return verdict{outcome: "retry", class: ClassHTTP, message: failure.Error(), breakerFail: true,
			err: jobs.RetryAfter(failure, max(delay, retryAfter(resp)))}
	case status >= 300 && status < 400:
		// Redirects are never followed; the endpoint is misconfigured but
		// may be fixed, so the schedule goes on.
		return verdict{outcome: "retry", class: ClassHTTP, message: failure.Error(), err: jobs.RetryAfter(failure, delay)}
	default:
		return verdict{outcome: "failed", class: ClassHTTP, message: failure.Error(), err: jobs.Permanent(failure)}
	}
}

func retryAfter(resp *Response) time.Duration {
	d, ok := retry.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if !ok {
		return 0
	}
	return d
}

// delay is the schedule's wait after the attempt-th attempt failed.
func (s *Store) delay(attempt int) time.Duration {
	sched := s.cfg.Schedule
	return sched[min(max(attempt, 1), len(sched)-1)]
}

type attemptRecord struct {
	p       deliveryPayload
	job     *jobs.Job
	url     string
	started time.Time
	latency time.Duration
	header  http.Header
	keys    []Key
	resp    *Response
	verdict verdict
}

// record writes the attempt's row and its consequences for the endpoint (the
// breaker, the auth counter and its alert, disabling on 410) in one
// transaction.
func (d *Dispatcher) record(ctx context.Context, r attemptRecord) error {
	keyIDs := make([]string, len(r.keys))
	for i, k := range r.keys {
		keyIDs[i] = k.ID
	}
	headers := make(map[string]string, len(r.header))
	for k := range r.header {
		headers[k] = r.header.Get(k)
	}
	// As JSON text: pgx has no encoding for a map where it does not know
	// the parameter's type (its exec and simple-protocol modes).
	headersJSON, err := json.Marshal(headers)
	if err != nil {
		return fmt.Errorf("webhook: request headers: %w", err)
	}
	var status *int
	var respBody *string
	if r.resp != nil {
		status = &r.resp.Status
		b := toValidUTF8(r.resp.Body)
		respBody = &b
	}
	tenant, ep := r.job.Tenant, r.p.EndpointID
	return d.withConn(ctx, func() error {
		return dbsql.WithTx(ctx, d.db, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, d.store.sql.insertAttempt, r.p.DeliveryID, r.job.ID, r.job.Attempt, cmp.Or(d.cfg.Worker, r.job.LeaseOwner), r.url, r.started,
				float64(r.latency)/float64(time.Millisecond), status, r.verdict.outcome, dbsql.NullIfZero(r.verdict.class),
				dbsql.NullIfZero(r.verdict.message), keyIDs, string(headersJSON), respBody)
			if err != nil {
				return err
			}
			switch v := r.verdict; {
			case v.outcome == "delivered":
				_, err = tx.Exec(ctx, d.store.sql.breakerSuccess, tenant, ep)
			case v.breakerFail:
				_, err = tx.Exec(ctx, d.store.sql.breakerFailure, tenant, ep, d.cfg.BreakerThreshold, d.cfg.BreakerCooldown.Milliseconds())
			case v.gone:
				if _, err = tx.Exec(ctx, d.store.sql.setStatus, tenant, ep, string(StatusDisabled), "gone: the endpoint answered 410"); err == nil {
					err = d.alert(ctx, tx, tenant, AlertDisabled, r, 0)
				}
			case v.auth:
				var n int
				if err = tx.QueryRow(ctx, d.store.sql.authFailure, tenant, ep).Scan(&n); err == nil && n == d.cfg.AuthAlertThreshold {
					err = d.alert(ctx, tx, tenant, AlertAuthFailing, r, n)
				}
			}
			return err
		})
	})
}

func (d *Dispatcher) alert(ctx context.Context, tx pgx.Tx, tenant, typ string, r attemptRecord, failures int) error {
	status := 0
	if r.resp != nil {
		status = r.resp.Status
	}
	payload, err := json.Marshal(map[string]any{
		"tenant": tenant, "endpoint_id": r.p.EndpointID, "delivery_id": r.p.DeliveryID,
		"url": r.url, "status": status, "consecutive_failures": failures,
	})
	if err != nil {
		return err
	}
	_, err = d.store.cfg.Outbox.Write(ctx, tx, outbox.Event{
		AggregateID: r.p.EndpointID, Topic: d.store.cfg.AlertTopic, Key: r.p.EndpointID.String(), Type: typ, Payload: payload,
		Headers: map[string]string{"tenant": tenant, "attempt": strconv.Itoa(r.job.Attempt)},
	})
	return err
}

// toValidUTF8 makes a response body storable as text: Postgres refuses NUL
// bytes and invalid UTF-8.
func toValidUTF8(b []byte) string {
	return strings.ToValidUTF8(strings.ReplaceAll(string(b), "\x00", ""), "\uFFFD")
}
