package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/schedule"
)

// schedules lists the schedules with their next slot, pauses and resumes
// one by name, prints JSON for scripts, and refuses an unknown name with
// exit 2.
func TestSchedules(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	store, err := schedule.NewStore(schedule.StoreConfig{Schema: f.schema})
	require.NoError(t, err)
	require.NoError(t, store.Put(t.Context(), f.pool, schedule.Schedule{
		Name: "nightly-digest", Cron: "30 2 * * *", TimeZone: "Europe/Berlin",
		Job: jobs.EnqueueParams{Tenant: "acme", Kind: "digest.build", Payload: json.RawMessage(`{}`)},
	}))

	code, out, stderr := f.run("schedules", "list")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^nightly-digest\s+30 2 \* \* \*\s+Europe/Berlin\s+digest.build\s+-\s+operator\s+active\s+\S+Z\s+-\s+-\s*$`, out)

	code, out, stderr = f.run("schedules", "pause", "nightly-digest")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^nightly-digest\s.*\spaused\s`, out)

	code, out, stderr = f.run("schedules", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list, 1)
	require.Equal(t, "nightly-digest", list[0]["name"])
	require.Equal(t, true, list[0]["paused"])
	require.Equal(t, "Europe/Berlin", list[0]["time_zone"])

	code, out, stderr = f.run("schedules", "resume", "nightly-digest", "--json")
	require.Equal(t, 0, code, stderr)
	var resumed struct {
		Paused   bool      `json:"paused"`
		NextSlot time.Time `json:"next_slot"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &resumed))
	require.False(t, resumed.Paused)
	require.True(t, resumed.NextSlot.After(time.Now()), "resuming skips the slots missed while paused")

	code, _, stderr = f.run("schedules", "pause", "no-such-schedule")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `no schedule is named "no-such-schedule"`)
	code, _, stderr = f.run("schedules", "pause")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "needs a schedule's name")
	code, _, _ = f.run("schedules", "rename")
	require.Equal(t, 2, code)
}

// With no schedule the table says so, and --json is an empty list.
func TestSchedulesEmpty(t *testing.T) {
	t.Parallel()
	f := setupMigrated(t)
	code, out, stderr := f.run("schedules", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "(no schedules)")
	code, out, stderr = f.run("schedules", "list", "--json")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `[]`, out)
}
