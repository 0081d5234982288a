package schedule_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
	"github.com/llmq/llmq/schedule"
)

var job = jobs.EnqueueParams{Tenant: "acme", Kind: "report.nightly"}

func TestValidationNamesTheField(t *testing.T) {
	t.Parallel()
	ok := schedule.Schedule{Name: "nightly", Cron: "0 3 * * *", TimeZone: "Europe/Berlin", Job: job}
	require.NoError(t, ok.Validate())
	for _, tc := range []struct {
		field string
		edit  func(*schedule.Schedule)
	}{
		{"Name", func(s *schedule.Schedule) { s.Name = "" }},
		{"Name", func(s *schedule.Schedule) { s.Name = strings.Repeat("n", 201) }},
		{"Name", func(s *schedule.Schedule) { s.Name = "a\nb" }},
		{"Cron", func(s *schedule.Schedule) { s.Cron = "61 * * * *" }},
		{"Cron", func(s *schedule.Schedule) { s.Cron = "* * * * * *" }},
		{"Cron", func(s *schedule.Schedule) { s.Cron = "@every 1h" }},
		{"Cron", func(s *schedule.Schedule) { s.Cron = "CRON_TZ=UTC 0 3 * * *" }},
		{"Cron", func(s *schedule.Schedule) { s.Cron = "0 0 30 2 *" }}, // February 30th
		{"Cron", func(s *schedule.Schedule) { s.Every = time.Minute }},
		{"Cron", func(s *schedule.Schedule) { s.Cron = "" }},
		{"TimeZone", func(s *schedule.Schedule) { s.TimeZone = "Mars/Olympus" }},
		{"TimeZone", func(s *schedule.Schedule) { s.TimeZone = "Local" }},
		{"Every", func(s *schedule.Schedule) { s.Cron, s.Every = "", 500*time.Millisecond }},
		{"Every", func(s *schedule.Schedule) { s.Cron, s.Every = "", 1500*time.Millisecond }},
		{"Every", func(s *schedule.Schedule) { s.Cron, s.Every = "", -time.Minute }},
		{"TimeZone", func(s *schedule.Schedule) { s.Cron, s.Every = "", time.Minute }}, // a zone with Every
		{"Jitter", func(s *schedule.Schedule) { s.Jitter = -time.Second }},
		{"Jitter", func(s *schedule.Schedule) { s.Jitter = 25 * time.Hour }},
		{"Misfire", func(s *schedule.Schedule) { s.Misfire = "later" }},
		{"CatchUpMax", func(s *schedule.Schedule) { s.CatchUpMax = 3 }}, // with skip
		{"CatchUpMax", func(s *schedule.Schedule) { s.Misfire, s.CatchUpMax = schedule.MisfireCatchUp, 1001 }},
		{"Job.Tenant", func(s *schedule.Schedule) { s.Job.Tenant = "" }},
		{"Job.Kind", func(s *schedule.Schedule) { s.Job.Kind = "" }},
		{"Job.IdempotencyKey", func(s *schedule.Schedule) { s.Job.IdempotencyKey = "mine" }},
		{"Job.AvailableAt", func(s *schedule.Schedule) { s.Job.AvailableAt = time.Now() }},
		{"Job.Payload", func(s *schedule.Schedule) { s.Job.Payload = json.RawMessage(`{`) }},
		{"Job.Priority", func(s *schedule.Schedule) { s.Job.Priority = 10 }},
	} {
		s := ok
		tc.edit(&s)
		err := s.Validate()
		var verr *llmqtype.ValidationError
		require.ErrorAs(t, err, &verr, "%+v", s)
		require.Equal(t, tc.field, verr.Field, "%+v: %v", s, err)
		require.ErrorIs(t, err, schedule.ErrInvalid)
	}
	// Descriptors and intervals are accepted.
	for _, s := range []schedule.Schedule{
		{Name: "h", Cron: "@hourly", Job: job},
		{Name: "d", Cron: "@daily", TimeZone: "America/New_York", Job: job},
		{Name: "e", Every: 90 * time.Second, Jitter: 90 * time.Second, Job: job},
		{Name: "c", Cron: "*/5 * * * *", Jitter: 5 * time.Minute, Misfire: schedule.MisfireCatchUp, Job: job},
	} {
		require.NoError(t, s.Validate(), "%+v", s)
	}
}

type args struct {
	Day string `json:"day"`
}

func TestForKindBuildsTheJob(t *testing.T) {
	t.Parallel()
	kind := jobs.NewKind[args, struct{}]("report.daily")
	p, err := schedule.ForKind(kind, "acme", args{Day: "today"}, jobs.EnqueueOptions{Queue: "reports", Priority: 2})
	require.NoError(t, err)
	require.Equal(t, "report.daily", p.Kind)
	require.Equal(t, "acme", p.Tenant)
	require.Equal(t, "reports", p.Queue)
	require.JSONEq(t, `{"day":"today"}`, string(p.Payload))
	require.NoError(t, schedule.Schedule{Name: "daily", Cron: "@daily", Job: p}.Validate())
}

// A spec either validates, or is refused with a ValidationError naming a
// field; nothing panics.
func FuzzScheduleSpec(f *testing.F) {
	f.Add("0 3 * * *", int64(0), "Europe/Berlin", int64(0), "skip", 0)
	f.Add("", int64(time.Minute), "", int64(time.Second), "catch_up", 5)
	f.Add("@hourly", int64(0), "UTC", int64(time.Hour), "", 0)
	f.Add("*/7 1-5 1,15 * MON-FRI", int64(0), "America/New_York", int64(0), "skip", 0)
	f.Add("TZ=UTC 0 3 * * *", int64(0), "", int64(0), "", 0)
	f.Fuzz(func(t *testing.T, cron string, every int64, zone string, jitter int64, misfire string, catchUp int) {
		s := schedule.Schedule{Name: "fuzz", Cron: cron, Every: time.Duration(every), TimeZone: zone,
			Jitter: time.Duration(jitter), Misfire: schedule.MisfirePolicy(misfire), CatchUpMax: catchUp, Job: job}
		err := s.Validate()
		if err == nil {
			return
		}
		var verr *llmqtype.ValidationError
		if !errors.As(err, &verr) || verr.Field == "" || !errors.Is(err, schedule.ErrInvalid) {
			t.Fatalf("%+v: %v is not a ValidationError naming a field", s, err)
		}
	})
}

func TestSlotKey(t *testing.T) {
	t.Parallel()
	slot := time.Date(2026, 3, 29, 3, 30, 0, 0, time.FixedZone("CEST", 2*3600))
	require.Equal(t, "schedule:nightly:2026-03-29T01:30:00Z", schedule.SlotKey("nightly", slot))
}
