package invoice

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/broker"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

// BatchDelivered is the body's data of an upload's webhook
// (BatchCompletedEvent): how its extractions ended. Each succeeded
// extraction was delivered on its own (CompletedEvent); those that need
// review or failed are read through the API.
type BatchDelivered struct {
	BatchID        uuid.UUID `json:"batch_id"`
	StatusURL      string    `json:"status_url"`
	Total          int       `json:"total"`
	Succeeded      int       `json:"succeeded"`
	ReviewRequired int       `json:"review_required"`
	Failed         int       `json:"failed"`
	Cancelled      int       `json:"cancelled"`
}

// batchCompleted is the payload of jobs.BatchCompletedEvent.
type batchCompleted struct {
	BatchID        uuid.UUID `json:"batch_id"`
	Tenant         string    `json:"tenant"`
	Total          int       `json:"total"`
	Succeeded      int       `json:"succeeded"`
	ReviewRequired int       `json:"review_required"`
	Failed         int       `json:"failed"`
	Cancelled      int       `json:"cancelled"`
}

// NewEventRelay returns the relay of the service's outbox, publishing
// through EventPublisher(next). Run it in the worker processes (one holds
// the relay's lease, the others stand by); next is the host's broker, or
// nil for none.
func (s *Service) NewEventRelay(next broker.Publisher, cfg outbox.RelayConfig) (*outbox.Relay, error) {
	return s.Outbox.NewRelay(s.pool, s.EventPublisher(next), cfg)
}

// EventPublisher returns a publisher for the outbox relay that turns each
// upload's batch.completed event into one signed BatchCompletedEvent
// webhook for every endpoint of its tenant subscribed to it, and then
// hands every message to next (nil: none, and the events are only marked
// published, to be pruned after the relay's retention).
//
// The deliveries are written in a transaction of the publisher's own,
// committed before next is called. The relay publishes at least once, so
// an event may come again (next failed, the relay died before marking
// it): the delivery's event id is the batch's id, and an endpoint that
// has it already gets no second one, so each endpoint is sent one
// webhook per upload however often the event is published.
func (s *Service) EventPublisher(next broker.Publisher) broker.Publisher {
	return &eventPublisher{s: s, next: next}
}

type eventPublisher struct {
	s    *Service
	next broker.Publisher
}

func (p *eventPublisher) Publish(ctx context.Context, msgs []broker.Message) error {
	var done []batchCompleted
	for _, m := range msgs {
		if m.Topic != p.s.Jobs.Config().EventTopic || m.Headers[outbox.HeaderEventType] != jobs.BatchCompletedEvent {
			continue
		}
		var b batchCompleted
		if err := json.Unmarshal(m.Body, &b); err != nil || b.BatchID == uuid.Nil || b.Tenant == "" {
			// Written by the job store, never by a client: one that does
			// not parse is a bug to see, not an event to retry for ever.
			p.s.cfg.Logger.Error("invoice events: a batch.completed event that does not parse is not delivered", "event_id", m.ID, "err", err)
			continue
		}
		done = append(done, b)
	}
	if len(done) > 0 {
		if err := pgx.BeginFunc(ctx, p.s.pool, func(tx pgx.Tx) error {
			for _, b := range done {
				if err := p.s.deliverBatch(ctx, tx, b); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("invoice events: enqueueing upload webhooks: %w", err)
		}
	}
	if p.next == nil {
		return nil
	}
	return p.next.Publish(ctx, msgs)
}

func (p *eventPublisher) Close() error {
	if p.next == nil {
		return nil
	}
	return p.next.Close()
}

// deliverBatch enqueues, in tx, the upload webhook of a finished batch.
func (s *Service) deliverBatch(ctx context.Context, tx pgx.Tx, b batchCompleted) error {
	body, err := json.Marshal(BatchDelivered{
		BatchID: b.BatchID, StatusURL: "/extraction-batches/" + b.BatchID.String(), Total: b.Total,
		Succeeded: b.Succeeded, ReviewRequired: b.ReviewRequired, Failed: b.Failed, Cancelled: b.Cancelled,
	})
	if err != nil {
		return err
	}
	if _, err := s.Webhooks.Enqueue(ctx, tx, b.Tenant, webhook.Event{ID: b.BatchID.String(), Type: BatchCompletedEvent, Payload: body}); err != nil {
		return fmt.Errorf("batch %s: %w", b.BatchID, err)
	}
	return nil
}
