package console

import (
	"testing"
	"time"
)

// A figure is at a level from its threshold on, exactly.
func TestGradeBoundaries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		got, want level
	}{
		{grade(5*time.Minute-time.Nanosecond, 5*time.Minute, 30*time.Minute), levelOK},
		{grade(5*time.Minute, 5*time.Minute, 30*time.Minute), levelWarning},
		{grade(30*time.Minute-time.Nanosecond, 5*time.Minute, 30*time.Minute), levelWarning},
		{grade(30*time.Minute, 5*time.Minute, 30*time.Minute), levelCritical},
		{grade(0.0999, 0.10, 0.25), levelOK},
		{grade(0.10, 0.10, 0.25), levelWarning},
		{grade(0.25, 0.10, 0.25), levelCritical},
		{grade(int64(0), 1, 10), levelOK},
		{grade(int64(1), 1, 10), levelWarning},
		{grade(int64(9), 1, 10), levelWarning},
		{grade(int64(10), 1, 10), levelCritical},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
	for l, s := range map[level]string{levelOK: "ok", levelWarning: "warning", levelCritical: "critical"} {
		if l.String() != s {
			t.Errorf("%d prints %q", l, l.String())
		}
	}
}

// The zero Thresholds are the documented defaults.
func TestThresholdDefaults(t *testing.T) {
	t.Parallel()
	got, err := Thresholds{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := Thresholds{OldestRunnableAmber: 5 * time.Minute, OldestRunnableRed: 30 * time.Minute,
		FailureRateAmber: 0.10, FailureRateRed: 0.25, FailureMinFailures: 10, DeadLettersAmber: 1, DeadLettersRed: 10,
		ReviewAmber: 1, ReviewRed: 100, OutboxLagAmber: 2 * time.Minute, OutboxLagRed: 10 * time.Minute,
		RetentionAmber: 15 * time.Minute}
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
}
