package llmqtest

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
)

// RequireEvent returns the newest outbox event of eventType about
// aggregateID (a job's id, or the host's own entity) visible on db: pass
// the transaction under test to check that it wrote the event. It fails
// the test when there is none, listing the types there are.
func RequireEvent(ctx context.Context, t testing.TB, db jobs.DBTX, events *outbox.Store, aggregateID uuid.UUID, eventType string) outbox.Record {
	t.Helper()
	recs, err := events.ListByAggregate(ctx, db, aggregateID)
	if err != nil {
		t.Fatalf("llmqtest: reading events of %s: %v", aggregateID, err)
		return outbox.Record{}
	}
	types := make([]string, 0, len(recs))
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Type == eventType {
			return recs[i]
		}
		types = append(types, recs[i].Type)
	}
	t.Fatalf("llmqtest: no %q event about %s; there are %q", eventType, aggregateID, types)
	return outbox.Record{}
}
