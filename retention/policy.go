package retention

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/inbox"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/webhook"
)

// Never keeps a class of rows forever: set a Policy field to it.
const Never time.Duration = -1

// Default retentions (Policy's zero values).
const (
	DefaultSucceeded         = 24 * time.Hour
	DefaultReviewRequired    = 30 * 24 * time.Hour
	DefaultFailedTerminal    = 30 * 24 * time.Hour
	DefaultCancelled         = 7 * 24 * time.Hour
	DefaultIdempotencyWindow = 24 * time.Hour
	DefaultPublishedEvents   = 24 * time.Hour
	DefaultInboxRecords      = 7 * 24 * time.Hour
	DefaultWebhookDeliveries = 30 * 24 * time.Hour
	DefaultInboxQuarantine   = 30 * 24 * time.Hour
)

// ErrInvalidConfig is matched (errors.Is) by every error New returns for a
// bad Config or Policy.
var ErrInvalidConfig = errors.New("retention: invalid configuration")

// ConfigError is the error New returns for a bad Config or Policy: the
// field at fault ("Policy.InboxRecords", "BatchPause") and what is wrong
// with it. It matches ErrInvalidConfig.
type ConfigError struct {
	Field   string
	Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("retention: invalid configuration: %s %s", e.Field, e.Problem)
}

// Is makes a ConfigError match ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

func invalid(field, format string, args ...any) error {
	return &ConfigError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// Policy says how long each class of rows is kept. A zero field means its
// default; Never keeps the class forever; any other negative value is
// refused. Ages count from the moment the row's work ended: a job's
// finish, an event's publication, an id's receipt, a delivery's creation.
type Policy struct {
	// Finished jobs by state, with their attempts and keys (idempotency
	// keys, the tenant listing, replay keys). Review and dead letters are
	// kept longer by default: people act on them.
	Succeeded      time.Duration // default 24h
	ReviewRequired time.Duration // default 30 days
	FailedTerminal time.Duration // default 30 days (dead letters)
	Cancelled      time.Duration // default 7 days

	// IdempotencyWindow is the least time any finished job, and so its
	// idempotency key, is kept: a state's retention shorter than it is
	// raised to it. Inside the window a retry with the same key returns
	// the same job; once the job is pruned, the key is free and the same
	// key accepts a new job. Default 24h; Never is refused (keep the
	// states themselves forever instead).
	IdempotencyWindow time.Duration

	// PublishedEvents is how long published outbox events are kept
	// (default 24h, as a relay's own pruning). The relay and this service
	// run the same statement.
	PublishedEvents time.Duration
	// UnrelayedEvents is how long unpublished events are kept on a host
	// that runs no relay and leaves its events to retention. Default
	// Never: an unpublished event is work a relay has not done yet. It
	// applies only on a schema where no relay has ever held the leader
	// lease: once one has, nothing unpublished is deleted, since a relay
	// that stopped or is restarting must find its events.
	UnrelayedEvents time.Duration

	// InboxRecords is how long accepted message ids are remembered
	// (default 7 days, at least inbox.MinRetention): longer than any
	// broker redelivers, or a redelivered message is processed twice.
	InboxRecords time.Duration
	// WebhookDeliveries is how long deliveries and their attempts are kept
	// (default 30 days): at least webhook.RetentionFloor of the default
	// schedule (its whole span plus a day, about two days). Whatever it
	// is, a delivery whose job is unfinished, or is a dead letter still
	// kept (FailedTerminal, ReviewRequired, Cancelled), is kept with it.
	WebhookDeliveries time.Duration

	// InboxQuarantine is how long quarantined messages (poison, undecodable
	// or id-less messages the inbox set aside for people) are kept, counted
	// from their receipt. Default 30 days: long enough to be looked at and
	// replayed by hand; Never keeps them forever.
	InboxQuarantine time.Duration
}

// withDefaults fills zero fields and validates the result.
func (p Policy) withDefaults() (Policy, error) {
	p = p.filled()
	return p, p.validate()
}

// fields lists the policy's retentions by name, with their defaults.
func (p *Policy) fields() []policyField {
	return []policyField{
		{"Succeeded", &p.Succeeded, DefaultSucceeded},
		{"ReviewRequired", &p.ReviewRequired, DefaultReviewRequired},
		{"FailedTerminal", &p.FailedTerminal, DefaultFailedTerminal},
		{"Cancelled", &p.Cancelled, DefaultCancelled},
		{"IdempotencyWindow", &p.IdempotencyWindow, DefaultIdempotencyWindow},
		{"PublishedEvents", &p.PublishedEvents, DefaultPublishedEvents},
		{"UnrelayedEvents", &p.UnrelayedEvents, Never},
		{"InboxRecords", &p.InboxRecords, DefaultInboxRecords},
		{"WebhookDeliveries", &p.WebhookDeliveries, DefaultWebhookDeliveries},
		{"InboxQuarantine", &p.InboxQuarantine, DefaultInboxQuarantine},
	}
}

type policyField struct {
	name string
	v    *time.Duration
	def  time.Duration
}

// filled returns p with each zero field set to its default, whether or not
// p is valid: a policy recorded by an earlier version (llmq stats, llmq
// prune) reads with the defaults of the fields it did not have, even when
// a field it had is refused now.
func (p Policy) filled() Policy {
	for _, f := range p.fields() {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	return p
}

// validate checks a filled policy.
func (p Policy) validate() error {
	for _, f := range p.fields() {
		switch {
		case *f.v < 0 && *f.v != Never:
			return invalid("Policy."+f.name, "is %s; use 0 for the default, a positive duration, or Never", *f.v)
		case *f.v > 100*365*24*time.Hour:
			return invalid("Policy."+f.name, "is %s; use Never to keep rows forever", *f.v)
		}
	}
	if p.IdempotencyWindow == Never {
		return invalid("Policy.IdempotencyWindow", "is Never; give a duration, and set the job states to Never to keep jobs forever")
	}
	if p.InboxRecords != Never && p.InboxRecords < inbox.MinRetention {
		return invalid("Policy.InboxRecords", "is %s; use at least %s, to outlast the brokers' redeliveries", p.InboxRecords, inbox.MinRetention)
	}
	if floor := webhook.RetentionFloor(nil); p.WebhookDeliveries != Never && p.WebhookDeliveries < floor {
		return invalid("Policy.WebhookDeliveries", "is %s; use at least %s, the default delivery schedule's span plus a day", p.WebhookDeliveries, floor)
	}
	return nil
}

// Job returns how long finished jobs of state are kept: the state's
// retention raised to the idempotency window, or Never. A state that is
// not finished is never pruned.
func (p Policy) Job(state jobs.State) time.Duration {
	var d time.Duration
	switch state {
	case jobs.StateSucceeded:
		d = p.Succeeded
	case jobs.StateReviewRequired:
		d = p.ReviewRequired
	case jobs.StateFailedTerminal:
		d = p.FailedTerminal
	case jobs.StateCancelled:
		d = p.Cancelled
	default:
		return Never
	}
	if d == Never {
		return Never
	}
	return max(d, p.IdempotencyWindow)
}

// Batches returns how long finished batches (jobs.EnqueueBatch) are kept:
// the longest of the finished states' retentions, so a batch outlives
// every job it counted, or Never when any state is kept forever.
func (p Policy) Batches() time.Duration {
	var longest time.Duration
	for _, state := range finishedStates {
		d := p.Job(state)
		if d == Never {
			return Never
		}
		longest = max(longest, d)
	}
	return longest
}

// finishedStates are the states retention prunes, in pruning order.
var finishedStates = [...]jobs.State{jobs.StateSucceeded, jobs.StateCancelled, jobs.StateReviewRequired, jobs.StateFailedTerminal}

// MarshalJSON writes each retention as a Go duration ("24h0m0s") or
// "never", for the lease row and llmq's --json output.
func (p Policy) MarshalJSON() ([]byte, error) {
	show := func(d time.Duration) string {
		if d == Never {
			return "never"
		}
		return d.String()
	}
	return json.Marshal(map[string]string{
		"succeeded":          show(p.Succeeded),
		"review_required":    show(p.ReviewRequired),
		"failed_terminal":    show(p.FailedTerminal),
		"cancelled":          show(p.Cancelled),
		"idempotency_window": show(p.IdempotencyWindow),
		"published_events":   show(p.PublishedEvents),
		"unrelayed_events":   show(p.UnrelayedEvents),
		"inbox_records":      show(p.InboxRecords),
		"webhook_deliveries": show(p.WebhookDeliveries),
		"inbox_quarantine":   show(p.InboxQuarantine),
	})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for name, v := range map[string]*time.Duration{
		"succeeded": &p.Succeeded, "review_required": &p.ReviewRequired, "failed_terminal": &p.FailedTerminal,
		"cancelled": &p.Cancelled, "idempotency_window": &p.IdempotencyWindow, "published_events": &p.PublishedEvents,
		"unrelayed_events": &p.UnrelayedEvents, "inbox_records": &p.InboxRecords, "webhook_deliveries": &p.WebhookDeliveries,
		"inbox_quarantine": &p.InboxQuarantine,
	} {
		s, ok := m[name]
		switch {
		case !ok:
			continue
		case s == "never":
			*v = Never
		default:
			d, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("retention: policy %s: %w", name, err)
			}
			*v = d
		}
	}
	return nil
}

// DefaultPolicy returns the policy with every default filled in.
func DefaultPolicy() Policy {
	p, _ := Policy{}.withDefaults() // the zero policy is valid
	return p
}
