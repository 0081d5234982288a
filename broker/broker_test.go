package broker_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/broker"
)

func TestFailures(t *testing.T) {
	t.Parallel()
	require.Equal(t, []error{nil, nil}, broker.Failures(2, nil), "nil: all confirmed")

	down := errors.New("connection lost")
	require.Equal(t, []error{down, down, down}, broker.Failures(3, down), "any other error: none confirmed")

	unroutable := errors.New("unroutable")
	err := error(&broker.PublishError{Failed: map[int]error{1: unroutable, 7: down}})
	got := broker.Failures(3, err)
	require.Equal(t, []error{nil, unroutable, nil}, got, "only the named messages failed; out-of-range indexes are ignored")
	require.ErrorIs(t, err, unroutable)
	require.ErrorContains(t, err, "2 messages not confirmed")
	require.ErrorContains(t, err, "message 1: unroutable")
}
