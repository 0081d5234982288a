package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/llmq/llmq/broker"
)

// ErrDeliveryLimit is the reason of a message quarantined and rejected on
// the last delivery its broker makes (a RabbitMQ queue's delivery limit,
// see broker.LimitedDelivery): its handling failed there, and a nack would
// have let the broker dead-letter or drop it with no record in the inbox.
// Transient failures included: the limit is the broker's, not the
// ingress's.
var ErrDeliveryLimit = errors.New("inbox: the broker's delivery limit was reached")

// errUnrecordedLastDelivery reports a message whose last delivery failed
// and whose quarantine could not be written either (the database down): it
// is nacked, and the broker dead-letters it with no record in the inbox.
var errUnrecordedLastDelivery = errors.New("inbox: a message failed on its last delivery and could not be quarantined; the broker dead-letters it with no record in the inbox")

// lastDelivery reports whether d is its message's last delivery: handing
// it back would end the message on the broker's side.
func lastDelivery(d broker.Delivery) (attempt, limit int, last bool) {
	ld, ok := d.(broker.LimitedDelivery)
	if !ok {
		return 0, 0, false
	}
	attempt, limit = ld.DeliveryAttempt()
	return attempt, limit, limit > 0 && attempt >= limit
}

// settleLastDeliveries turns the nack of a message's last delivery into a
// quarantine and a reject, so that no message leaves the broker without a
// record in the inbox. It runs once the batch's outcome is known, whatever
// the failure (a handler's, a transient one, the batch's commit, a
// shutdown), each quarantine in a transaction of its own, taken from the
// ingress's connection budget.
func (in *Ingress) settleLastDeliveries(ctx context.Context, batch []broker.Delivery, verdicts []verdict) {
	for i, d := range batch {
		if verdicts[i].result != resultFailed {
			continue
		}
		if attempt, limit, last := lastDelivery(d); last {
			verdicts[i] = in.quarantineLast(ctx, d, attempt, limit, verdicts[i].err)
		}
	}
}

// quarantineLast quarantines d, whose handling failed with failure on its
// last delivery. It writes even when ctx has ended (the ingress stopping):
// a stopping consumer hands its deliveries back, which ends this one too.
func (in *Ingress) quarantineLast(ctx context.Context, d broker.Delivery, attempt, limit int, failure error) verdict {
	cause := fmt.Errorf("%w: delivery %d of at most %d failed: %w", ErrDeliveryLimit, attempt, limit, failure)
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), in.settleTimeout)
	defer cancel()
	var v verdict
	select {
	case in.conns <- struct{}{}:
		v = in.quarantine(qctx, in.db, d, cause)
		<-in.conns
	case <-qctx.Done():
		v = retryLater(qctx.Err())
	}
	if v.result != resultQuarantined {
		v.err = fmt.Errorf("%w: %w (quarantine: %w)", errUnrecordedLastDelivery, cause, v.err)
	}
	return v
}
