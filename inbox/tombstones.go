package inbox

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/trace"

	"github.com/llmq/llmq/broker"
)

// TombstonePolicy says what the ingress does with a message whose body is
// null: a Kafka tombstone, which change-data-capture producers (Debezium
// and the like) write after a row's deletion so that compaction can drop
// its key. Only Kafka delivers null bodies.
type TombstonePolicy int

const (
	// QuarantineTombstones quarantines and rejects tombstones (to the
	// dead-letter topic, byte for byte) as messages that can never be
	// accepted: an event needs a payload, if only an empty one. The
	// default.
	QuarantineTombstones TombstonePolicy = iota
	// SkipTombstones acknowledges tombstones without handling them, so the
	// partition's commit moves past them, and writes nothing: no inbox
	// row, no quarantine row. Each is counted (llmq.inbox.messages, result
	// skipped) and logged at debug level with its topic, partition and
	// offset. For topics whose deletions the handler learns from the
	// change events themselves.
	SkipTombstones
	// HandleTombstones hands tombstones to the handler, Body nil, as any
	// other message: each needs an id (one without is quarantined), is
	// recorded in the inbox and deduplicated by it, and is quarantined if
	// its handling fails as any message's is. Its payload digest is the
	// empty payload's. For handlers that apply deletions.
	HandleTombstones
)

func (p TombstonePolicy) String() string {
	switch p {
	case QuarantineTombstones:
		return "quarantine"
	case SkipTombstones:
		return "skip"
	case HandleTombstones:
		return "handle"
	}
	return fmt.Sprintf("TombstonePolicy(%d)", int(p))
}

func (p TombstonePolicy) valid() bool { return p >= QuarantineTombstones && p <= HandleTombstones }

// check is checkMessage under the ingress's tombstone policy: a null body
// the handler takes is checked as an empty one.
func (in *Ingress) check(msg broker.Message) error {
	if msg.Body == nil && in.cfg.Tombstones == HandleTombstones {
		msg.Body = []byte{}
	}
	return checkMessage(msg)
}

// skipped is the verdict on a tombstone the ingress skips.
func skipped() verdict { return verdict{settle: ack, result: resultSkipped} }

// decideSkipping is decide for a batch in which, under SkipTombstones,
// tombstones are acknowledged without a transaction: only the other
// deliveries, if any, go to the database.
func (in *Ingress) decideSkipping(ctx context.Context, spans []trace.Span, batch []broker.Delivery) []verdict {
	if in.cfg.Tombstones != SkipTombstones {
		return in.decide(ctx, spans, batch)
	}
	verdicts := make([]verdict, len(batch))
	var rest []int
	for i, d := range batch {
		if d.Message().Body != nil {
			rest = append(rest, i)
			continue
		}
		verdicts[i] = skipped()
		in.cfg.Logger.Debug("llmq: tombstone skipped", "consumer", in.cfg.Consumer, "message", d.Message().ID, "source", d.Source())
	}
	switch len(rest) {
	case 0:
		return verdicts
	case len(batch):
		return in.decide(ctx, spans, batch)
	}
	sub, subSpans := make([]broker.Delivery, len(rest)), []trace.Span(nil)
	if spans != nil {
		subSpans = make([]trace.Span, len(rest))
	}
	for j, i := range rest {
		sub[j] = batch[i]
		if spans != nil {
			subSpans[j] = spans[i]
		}
	}
	for j, v := range in.decide(ctx, subSpans, sub) {
		verdicts[rest[j]] = v
	}
	return verdicts
}
