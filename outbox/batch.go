package outbox

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/llmqtype"
)

//go:embed batches.sql
var batchesSQL string

// Limits of one WriteBatch call. A batch row holds its events in one json
// value, whose size PostgreSQL bounds (at 1 GiB, and each event's payload,
// which passes through jsonb, at 255 MiB); these bounds keep a row well
// inside them and a claim's memory bounded.
const (
	MaxBatchEvents = 10_000
	MaxBatchBytes  = 64 << 20 // payloads and headers together
)

// WriteBatch validates events and inserts them on db as one batch row, in
// the order given, and returns them as stored (IDs filled in, each with
// its own Seq). Write them in the transaction that makes the change they
// describe, as with Write. The events are published as if written one by
// one in that order (key order holds across both, see the package
// documentation), and cost the database a sixth of the WAL single-event
// rows do when a batch holds tens of events, and the relay almost none.
//
// One event is written as Write writes it: a batch row of one event costs
// the relay more than a single-event row. An invalid event, or two events
// with the same ID, fail the whole call with a *llmqtype.ValidationError
// whose Field names the event (Events[3].Topic), and nothing is written.
// A batch holds at most MaxBatchEvents events and MaxBatchBytes of
// payloads and headers.
func (s *Store) WriteBatch(ctx context.Context, db DBTX, events []Event) ([]Record, error) {
	switch len(events) {
	case 0:
		return nil, nil
	case 1:
		rec, err := s.Write(ctx, db, events[0])
		if err != nil {
			return nil, err
		}
		return []Record{rec}, nil
	}
	cols, err := s.batchColumns(ctx, events)
	if err != nil {
		return nil, err
	}
	var (
		seqs    []int64
		created time.Time
	)
	err = db.QueryRow(ctx, s.sql.insertBatch,
		cols.ids, cols.aggregates, cols.topics, cols.keys, cols.types, cols.payloads, cols.headers, s.channel,
	).Scan(&seqs, &created)
	if err != nil {
		err = dbsql.Explain(err, s.schema.Name(), "outbox.Config.Schema")
		return nil, fmt.Errorf("outbox: writing a batch of %d events: %w", len(events), err)
	}
	if len(seqs) != len(cols.records) {
		return nil, fmt.Errorf("outbox: writing a batch of %d events: the database returned %d seqs", len(events), len(seqs))
	}
	for i := range cols.records {
		cols.records[i].Seq, cols.records[i].CreatedAt = seqs[i], created
	}
	return cols.records, nil
}

// batchColumns is a batch's events validated, as InsertBatch's arrays.
type batchColumns struct {
	records                          []Record
	ids, aggregates                  []pgtype.UUID // see dbsql.UUID; a NULL aggregate for none
	topics, types, payloads, headers []string
	keys                             []*string
}

func (s *Store) batchColumns(ctx context.Context, events []Event) (*batchColumns, error) {
	if len(events) > MaxBatchEvents {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidEvent, Field: "Events",
			Problem: fmt.Sprintf("has %d events, more than the limit of %d", len(events), MaxBatchEvents)}
	}
	n := len(events)
	c := &batchColumns{
		records: make([]Record, n), ids: make([]pgtype.UUID, n), aggregates: make([]pgtype.UUID, n),
		topics: make([]string, n), types: make([]string, n), payloads: make([]string, n),
		headers: make([]string, n), keys: make([]*string, n),
	}
	seen := make(map[uuid.UUID]int, n)
	bytes := 0
	for i, ev := range events {
		if err := s.validate(&ev); err != nil {
			if ve := (*llmqtype.ValidationError)(nil); errors.As(err, &ve) {
				named := *ve
				named.Field = fmt.Sprintf("Events[%d].%s", i, ve.Field)
				return nil, &named
			}
			return nil, err
		}
		if j, dup := seen[ev.ID]; dup {
			return nil, &llmqtype.ValidationError{Kind: ErrInvalidEvent, Field: fmt.Sprintf("Events[%d].ID", i),
				Problem: fmt.Sprintf("is %s, the ID of Events[%d] too; an ID identifies one event", ev.ID, j)}
		}
		seen[ev.ID] = i
		ev.Headers = s.withTraceContext(ctx, ev.Headers)
		headers, err := headersJSON(ev)
		if err != nil {
			return nil, err
		}
		bytes += len(ev.Payload) + len(headers)
		if bytes > MaxBatchBytes {
			return nil, &llmqtype.ValidationError{Kind: ErrInvalidEvent, Field: fmt.Sprintf("Events[%d]", i),
				Problem: fmt.Sprintf("takes the batch's payloads and headers past the limit of %d bytes", MaxBatchBytes)}
		}
		c.records[i] = Record{Event: ev}
		c.ids[i] = dbsql.UUID(ev.ID)
		if ev.AggregateID != uuid.Nil {
			c.aggregates[i] = dbsql.UUID(ev.AggregateID)
		}
		c.topics[i], c.types[i], c.payloads[i], c.headers[i] = ev.Topic, ev.Type, string(ev.Payload), headers
		c.keys[i] = dbsql.NullIfZero(ev.Key)
	}
	return c, nil
}

// batchEvent is an event as a batch row's events array holds it
// (InsertBatch).
type batchEvent struct {
	Seq       int64             `json:"seq"`
	ID        uuid.UUID         `json:"id"`
	Aggregate uuid.UUID         `json:"aggregate"`
	Topic     string            `json:"topic"`
	Key       string            `json:"key"`
	Type      string            `json:"type"`
	Payload   json.RawMessage   `json:"payload"`
	Headers   map[string]string `json:"headers"`
}

// claimedBatch is a batch row a claim took (ClaimBatch).
type claimedBatch struct {
	firstSeq int64
	attempts int // this claim's included
	events   []Record
	held     map[int64]bool // seqs an earlier single-event row of their key holds back
}

func scanClaimedBatch(row claimedBatchRow) (*claimedBatch, error) {
	var evs []batchEvent
	if err := json.Unmarshal(row.events, &evs); err != nil {
		return nil, fmt.Errorf("events of batch row %d: %w", row.firstSeq, err)
	}
	b := &claimedBatch{firstSeq: row.firstSeq, attempts: row.attempts, events: make([]Record, len(evs)), held: map[int64]bool{}}
	for i, e := range evs {
		b.events[i] = Record{
			Event: Event{ID: e.ID, AggregateID: e.Aggregate, Topic: e.Topic, Key: e.Key, Type: e.Type, Payload: e.Payload, Headers: e.Headers},
			Seq:   e.Seq, CreatedAt: row.createdAt, Attempts: row.attempts,
		}
	}
	for _, seq := range row.held {
		b.held[seq] = true
	}
	return b, nil
}

func (b *claimedBatch) lastSeq() int64 { return b.events[len(b.events)-1].Seq }

// batchVerdict is the broker's verdict on one claimed batch row: how many
// of its events were confirmed and how many refused, and which were split
// out (SettleBatch), with the error of each (empty: not attempted) and
// its backoff.
type batchVerdict struct {
	firstSeq           int64
	published, refused int
	split              []int64
	errs               []string
	delays             []int64
}

func (bv *batchVerdict) splitOut(rec Record, err string, delay time.Duration) {
	bv.split = append(bv.split, rec.Seq)
	bv.errs = append(bv.errs, err)
	bv.delays = append(bv.delays, delay.Milliseconds())
}

// errNeverSettled is the error a batch row's events are split out with when
// a claim finds the row claimed before and never settled.
const errNeverSettled = "its batch row was claimed before and never settled (the relay stopped or its publication hung)"

// publishBatches publishes the events of the claimed batch rows, which
// are in write order, and returns the verdicts that settle them, one per
// row. A row never backs off: every event is either confirmed or split out
// into a single-event row, which is retried as any other (SettleBatch):
//   - every event of a row, unpublished, when the row was claimed before
//     and that claim never settled: the row may be what stops its
//     publisher (a message the broker hangs on), and a row held back holds
//     every batch row after it, where a single-event row holds only its
//     key;
//   - an event an earlier unpublished single-event row of its key holds
//     back (ClaimBatches found it), unpublished;
//   - an event the broker refused, with its error and a backoff;
//   - an event whose key's earlier event in these rows was split out,
//     unpublished.
//
// Events are published in waves: each wave holds the next event of each
// key, so a key's later event is published only after its earlier one was
// confirmed. Events with no key all go in the first wave.
func (r *Relay) publishBatches(ctx context.Context, rows []*claimedBatch) []batchVerdict {
	verdicts := make([]batchVerdict, len(rows))
	row := map[int64]int{}   // event seq → its row's index
	held := map[int64]bool{} // events ClaimBatches found held back
	stopped := splitKeys{}
	var pending []Record
	for i, b := range rows {
		verdicts[i].firstSeq = b.firstSeq
		if b.attempts > 1 {
			for _, rec := range b.events {
				verdicts[i].splitOut(rec, errNeverSettled, 0)
				stopped.add(rec)
			}
			r.cfg.Logger.WarnContext(ctx, "llmq: outbox batch row was claimed before and never settled; its events are retried one by one",
				"first_seq", b.firstSeq, "events", len(b.events))
			continue
		}
		for _, rec := range b.events {
			row[rec.Seq] = i
			held[rec.Seq] = b.held[rec.Seq]
			pending = append(pending, rec)
		}
	}
	for len(pending) > 0 {
		var wave, later []Record
		inWave := map[string]bool{}
		for _, rec := range pending {
			switch {
			case held[rec.Seq] || stopped.after(rec):
				verdicts[row[rec.Seq]].splitOut(rec, "", 0)
				stopped.add(rec)
			case rec.Key != "" && inWave[rec.Key]:
				later = append(later, rec)
			default:
				inWave[rec.Key] = rec.Key != ""
				wave = append(wave, rec)
			}
		}
		// A wave holds one event per key, so it may go out in parts: no
		// Publish call carries more than BatchSize messages, however large
		// the rows (an enqueue of 5,000 jobs writes one row).
		for part := range slices.Chunk(wave, r.cfg.BatchSize) {
			r.publishWave(ctx, part, verdicts, row, stopped)
		}
		pending = later
	}
	return verdicts
}

// publishWave publishes one wave of publishBatches and records the
// broker's verdict on each of its events in their rows' verdicts.
func (r *Relay) publishWave(ctx context.Context, wave []Record, verdicts []batchVerdict, row map[int64]int, stopped splitKeys) {
	failures, pubErr := r.send(ctx, wave)
	refused := 0
	for i, rec := range wave {
		bv := &verdicts[row[rec.Seq]]
		if failures[i] == nil {
			bv.published++
			continue
		}
		refused++
		bv.refused++
		bv.splitOut(rec, failures[i].Error(), r.cfg.Backoff.Delay(1, nil))
		stopped.add(rec)
	}
	if refused > 0 {
		r.cfg.Logger.WarnContext(ctx, "llmq: outbox events of batch rows not confirmed; they will be retried one by one",
			"failed", refused, "of", len(wave), "err", pubErr)
	}
}

// splitKeys holds, for each key with an event split out of the claimed
// rows, the lowest such event's seq: every later event of the key must be
// split too, and earlier ones need not be.
type splitKeys map[string]int64

func (k splitKeys) add(rec Record) {
	if rec.Key == "" {
		return
	}
	if seq, ok := k[rec.Key]; !ok || rec.Seq < seq {
		k[rec.Key] = rec.Seq
	}
}

// after reports whether an earlier event of rec's key was split out.
func (k splitKeys) after(rec Record) bool {
	seq, ok := k[rec.Key]
	return rec.Key != "" && ok && seq < rec.Seq
}
