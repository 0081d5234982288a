package retention

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
)

// Due counts what a pass would delete now under the service's policy,
// class by class, without deleting anything or taking the lease (llmq
// prune --dry-run). Jobs are counted per state; their attempts and keys
// go with them. Each count reads the due range of an index, so it costs
// in proportion to what is due.
func (s *Service) Due(ctx context.Context) ([]Count, error) {
	p := s.cfg.Policy
	var out []Count
	for _, state := range finishedStates {
		keep := p.Job(state)
		if keep == Never {
			continue
		}
		n, err := s.jobs.CountFinished(ctx, s.pool, state, keep)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "jobs", Class: string(state), Rows: n})
	}
	if keep := p.Batches(); keep != Never {
		n, err := s.jobs.CountBatches(ctx, s.pool, keep)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "job_batches", Rows: n})
	}
	n, err := s.jobs.CountReuseInvalidations(ctx, s.pool, jobs.ReuseInvalidationRetention(p.Job(jobs.StateSucceeded)))
	if err != nil {
		return nil, err
	}
	out = append(out, Count{Table: "job_reuse_invalidations", Rows: n})
	if p.PublishedEvents != Never {
		n, err := s.outbox.CountPublished(ctx, s.pool, p.PublishedEvents)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "outbox", Class: "published", Rows: n})
	}
	if p.UnrelayedEvents != Never {
		n, err := s.outbox.CountUnrelayed(ctx, s.pool, p.UnrelayedEvents)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "outbox", Class: "unpublished", Rows: n})
	}
	if p.InboxRecords != Never {
		n, err := s.inbox.Count(ctx, s.pool, p.InboxRecords)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "inbox", Rows: n})
	}
	if p.InboxQuarantine != Never {
		n, err := s.inbox.CountQuarantine(ctx, s.pool, p.InboxQuarantine)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "inbox_quarantine", Rows: n})
	}
	if p.WebhookDeliveries != Never {
		n, err := s.webhook.Count(ctx, s.pool, p.WebhookDeliveries)
		if err != nil {
			return nil, err
		}
		out = append(out, Count{Table: "webhook_deliveries", Rows: n})
	}
	n, _, err = s.admission.CountExpired(ctx, s.pool)
	if err != nil {
		return nil, err
	}
	return append(out, Count{Table: "admission_permits", Class: "expired", Rows: n}), nil
}

// Oldest is the oldest row of one class of a table.
type Oldest struct {
	Table string    `json:"table"`
	Class string    `json:"class,omitempty"`
	At    time.Time `json:"at"` // zero: the class has no rows
	// Rows is how many rows the class holds, for finished jobs only (-1
	// elsewhere): exact up to jobs.ExactSizeLimit, estimated from the
	// planner's statistics beyond (Estimated).
	Rows      int64 `json:"rows"`
	Estimated bool  `json:"estimated,omitempty"`
}

// Status is what operators see of retention (llmq stats).
type Status struct {
	// Holder is the process holding the lease ("" when none does), until
	// LeaseUntil.
	Holder     string    `json:"holder"`
	LeaseUntil time.Time `json:"lease_until"`
	// Held is whether Holder's lease is current by the database's clock.
	Held bool `json:"held"`
	// Now is the database's clock when Status read it: ages are relative
	// to it, not to the reader's clock.
	Now time.Time `json:"now"`
	// Policy is the holder's (or the last holder's) policy; nil when no
	// retention service ever ran on the schema.
	Policy *Policy `json:"policy"`
	// LastPass is what the last pass deleted, at LastPassAt.
	LastPassAt time.Time `json:"last_pass_at"`
	LastPass   *Pass     `json:"last_pass"`
	// Oldest is the oldest row per table and class, each read from the
	// first entry of an index.
	Oldest []Oldest `json:"oldest"`
	// Relay is the outbox relays' leader lease: with no acquisition ever,
	// no relay runs on this schema, and unpublished events are not lag.
	Relay outbox.RelayLeaseState `json:"relay"`
}

// Status reads the lease, the last pass, the oldest row per table and the
// number of finished jobs per state. Every read is an index probe, a
// bounded index range, a catalog read or a one-row table: it stays fast at
// any history size.
func (s *Service) Status(ctx context.Context) (Status, error) {
	var st Status
	row := leaseRow{st: &st}
	if err := s.pool.QueryRow(ctx, s.sql.readLease).Scan(row.dest()...); err != nil {
		return st, fmt.Errorf("retention: reading the lease: %w", err)
	}
	until, lastAt, policy, last := row.until, row.lastAt, row.policy, row.last
	if until != nil {
		st.LeaseUntil = *until
	}
	if lastAt != nil {
		st.LastPassAt = *lastAt
	}
	if policy != nil {
		st.Policy = &Policy{}
		if err := json.Unmarshal(policy, st.Policy); err != nil {
			return st, fmt.Errorf("retention: reading the recorded policy: %w", err)
		}
		// A policy recorded before a field existed has it zero: its
		// default applies, even when another field is refused now (a
		// WebhookDeliveries below the floor added since): it is shown as
		// recorded, and New says what is wrong should it be used.
		*st.Policy = st.Policy.filled()
	}
	if last != nil {
		st.LastPass = &Pass{}
		if err := json.Unmarshal(last, st.LastPass); err != nil {
			return st, fmt.Errorf("retention: reading the last pass: %w", err)
		}
	}
	sizes, err := s.jobs.SizeFinished(ctx, s.pool)
	if err != nil {
		return st, err
	}
	for _, state := range finishedStates {
		at, err := s.jobs.OldestFinished(ctx, s.pool, state)
		if err != nil {
			return st, err
		}
		st.Oldest = append(st.Oldest, Oldest{Table: "jobs", Class: string(state), At: at, Rows: sizes[state].Rows, Estimated: sizes[state].Estimated})
	}
	pub, unpub, err := s.outbox.Oldest(ctx, s.pool)
	if err != nil {
		return st, err
	}
	st.Oldest = append(st.Oldest, Oldest{Table: "outbox", Class: "published", At: pub, Rows: -1}, Oldest{Table: "outbox", Class: "unpublished", At: unpub, Rows: -1})
	at, err := s.inbox.Oldest(ctx, s.pool)
	if err != nil {
		return st, err
	}
	st.Oldest = append(st.Oldest, Oldest{Table: "inbox", At: at, Rows: -1})
	if at, err = s.inbox.OldestQuarantine(ctx, s.pool); err != nil {
		return st, err
	}
	st.Oldest = append(st.Oldest, Oldest{Table: "inbox_quarantine", At: at, Rows: -1})
	if at, err = s.webhook.Oldest(ctx, s.pool); err != nil {
		return st, err
	}
	st.Oldest = append(st.Oldest, Oldest{Table: "webhook_deliveries", At: at, Rows: -1})
	if _, at, err = s.admission.CountExpired(ctx, s.pool); err != nil {
		return st, err
	}
	st.Oldest = append(st.Oldest, Oldest{Table: "admission_permits", At: at, Rows: -1})
	if st.Relay, err = s.outbox.RelayLease(ctx, s.pool); err != nil {
		return st, err
	}
	return st, nil
}
