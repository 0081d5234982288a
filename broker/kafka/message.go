package kafka

import (
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/llmq/llmq/broker"
)

// Record headers this package writes.
const (
	// HeaderMessageID carries Message.ID. It has the value of
	// outbox.HeaderEventID, so an outbox event's id header and the
	// message id are one header.
	HeaderMessageID = "llmq-event-id"
	// HeaderDeadLetterReason, on a dead-lettered record, says why it was
	// rejected.
	HeaderDeadLetterReason = "llmq-dead-letter-reason"
	// HeaderDeadLetterSource, on a dead-lettered record, names where it
	// was consumed from: "topic/partition/offset".
	HeaderDeadLetterSource = "llmq-dead-letter-source"
)

// toRecord builds the record of msg: its key, its body as the value (never
// null: a nil Body is an empty value, not a tombstone), its headers in key
// order, and its id in HeaderMessageID (which wins over a header of that
// name in msg.Headers).
func toRecord(msg broker.Message) *kgo.Record {
	value := msg.Body
	if value == nil {
		value = []byte{}
	}
	r := &kgo.Record{Topic: msg.Topic, Value: value}
	if msg.Key != "" {
		r.Key = []byte(msg.Key)
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(msg.Headers)+1)
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte(msg.ID)})
	for _, k := range slices.Sorted(maps.Keys(msg.Headers)) {
		if k != HeaderMessageID {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(msg.Headers[k])})
		}
	}
	return r
}

// toMessage reads a consumed record. The id is the HeaderMessageID header;
// a record without one (written by another producer) has an empty ID,
// which receivers treat as malformed (package inbox quarantines it). Every
// header, the id header included, is in Headers; of repeated header keys
// the last wins, and a null header value is "". The value is the Body as
// it is: nil for a null value (a tombstone), non-nil for an empty one. A
// null key is "", as is an empty one. Bytes are passed on unjudged.
func toMessage(r *kgo.Record) broker.Message {
	msg := broker.Message{Topic: r.Topic, Key: string(r.Key), Body: r.Value}
	if len(r.Headers) > 0 {
		msg.Headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			msg.Headers[h.Key] = string(h.Value)
		}
		msg.ID = msg.Headers[HeaderMessageID]
	}
	return msg
}
