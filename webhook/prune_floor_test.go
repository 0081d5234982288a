package webhook_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/outbox"
	"github.com/llmq/llmq/webhook"
)

// RetentionFloor is the floor NewStore holds Config.Retention to: the
// schedule's whole span plus a day, the default schedule's when none is
// given. The retention service holds Policy.WebhookDeliveries to it.
func TestRetentionFloorIsTheStoresFloor(t *testing.T) {
	t.Parallel()
	var span time.Duration
	for _, d := range webhook.DefaultSchedule() {
		span += d
	}
	require.Equal(t, span+24*time.Hour, webhook.RetentionFloor(nil))
	schedule := []time.Duration{0, time.Hour, 3 * time.Hour}
	floor := webhook.RetentionFloor(schedule)
	require.Equal(t, 28*time.Hour, floor)
	js, err := jobs.NewStore(jobs.Config{Queues: []string{jobs.DefaultQueue, webhook.DefaultQueue}})
	require.NoError(t, err)
	ob, err := outbox.NewStore(outbox.Config{})
	require.NoError(t, err)
	_, err = webhook.NewStore(webhook.Config{Jobs: js, Outbox: ob, Schedule: schedule, Retention: floor})
	require.NoError(t, err)
	_, err = webhook.NewStore(webhook.Config{Jobs: js, Outbox: ob, Schedule: schedule, Retention: floor - time.Second})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
}

// A schedule step longer than a retry may wait is refused, naming the
// step, rather than shortened without a word.
func TestScheduleStepsFitARetrysWait(t *testing.T) {
	t.Parallel()
	js, err := jobs.NewStore(jobs.Config{Queues: []string{jobs.DefaultQueue, webhook.DefaultQueue}})
	require.NoError(t, err)
	ob, err := outbox.NewStore(outbox.Config{})
	require.NoError(t, err)
	_, err = webhook.NewStore(webhook.Config{Jobs: js, Outbox: ob, Schedule: []time.Duration{0, 24 * time.Hour}, Retention: 30 * 24 * time.Hour})
	require.NoError(t, err)
	_, err = webhook.NewStore(webhook.Config{Jobs: js, Outbox: ob, Schedule: []time.Duration{0, 48 * time.Hour}, Retention: 30 * 24 * time.Hour})
	require.ErrorIs(t, err, webhook.ErrInvalidConfig)
	require.ErrorContains(t, err, "Schedule[1]")
}
