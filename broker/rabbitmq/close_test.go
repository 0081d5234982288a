package rabbitmq_test

import (
	"log/slog"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker/rabbitmq"
)

// Closing a Publisher or Consumer from several goroutines at once is safe
// (they are documented safe for concurrent use): every Close returns nil and
// none panics. The broker is unreachable, so that no connection is needed
// for the supervisor to be running.
func TestCloseConcurrently(t *testing.T) {
	t.Parallel()
	conn := rabbitmq.ConnConfig{URL: "amqp://guest:guest@127.0.0.1:1/", Logger: slog.New(slog.DiscardHandler)}
	closeAll := func(t *testing.T, closers int, closeFn func() error) {
		t.Helper()
		start := make(chan struct{})
		errs := make(chan error, closers)
		var wg sync.WaitGroup
		for range closers {
			wg.Go(func() {
				<-start
				errs <- closeFn()
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	for range 300 {
		p, err := rabbitmq.NewPublisher(rabbitmq.PublisherConfig{ConnConfig: conn})
		require.NoError(t, err)
		closeAll(t, 8, p.Close)
	}
	for range 300 {
		c, err := rabbitmq.NewConsumer(rabbitmq.ConsumerConfig{ConnConfig: conn, Queue: "q"})
		require.NoError(t, err)
		closeAll(t, 8, c.Close)
	}
}
