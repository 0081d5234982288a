package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The server's CPU is every postgres process's own time and its reaped
// children's: the postmaster's cutime keeps what exited backends used.
func TestPostgresCPU(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(pid, stat string) {
		require.NoError(t, os.MkdirAll(filepath.Join(root, pid), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, pid, "stat"), []byte(stat), 0o600))
	}
	write("100", "100 (postgres) S 1 100 100 0 -1 0 0 0 0 0 50 20 300 30 20 0 1 0 5 0 0")  // the postmaster: 70 own, 330 reaped
	write("101", "101 (postgres) S 100 100 100 0 -1 0 0 0 0 0 400 100 0 0 20 0 1 0 5 0 0") // a backend
	write("102", "102 (llmq) R 1 102 102 0 -1 0 0 0 0 0 999 999 0 0 20 0 1 0 5 0 0")       // not postgres
	write("103", "103 (postgres: wal) S 1 1 1 0 -1 0 0 0 0 0 7 7 0 0 20 0 1 0 5 0 0")      // another name
	require.NoError(t, os.MkdirAll(filepath.Join(root, "self"), 0o755))                    // not a pid
	total, ok := postgresCPU(root)
	require.True(t, ok)
	require.Equal(t, 900*10*time.Millisecond, total)

	_, ok = postgresCPU(t.TempDir())
	require.False(t, ok, "no postgres process: the database is elsewhere")
	_, ok = postgresCPU(filepath.Join(root, "missing"))
	require.False(t, ok)

	for _, bad := range []string{"", "1 (postgres) S", "1 (postgres) S 1 1 1 0 -1 0 0 0 0 0 x 1 1 1", "1 postgres S 1 1 1 0 -1 0 0 0 0 0 1 1 1 1"} {
		_, isPostgres := postgresStatCPU(bad)
		require.False(t, isPostgres, bad)
	}
}

// A phase's CPU per job is the difference of two samples over the jobs;
// without a local server only the client's is reported.
func TestCPUReport(t *testing.T) {
	t.Parallel()
	r := &benchReport{}
	r.cpu(cpuSample{client: time.Second, server: 2 * time.Second, allocs: 500, clientOK: true, serverOK: true},
		cpuSample{client: 3 * time.Second, server: 6 * time.Second, allocs: 40_500, clientOK: true, serverOK: true}, 1000)
	require.NotNil(t, r.CPU)
	require.InDelta(t, 2000, r.CPU.ClientUSPerJob, 1e-9)
	require.InDelta(t, 40, r.CPU.ClientAllocsPerJob, 1e-9)
	require.NotNil(t, r.CPU.ServerUSPerJob)
	require.InDelta(t, 4000, *r.CPU.ServerUSPerJob, 1e-9)

	r = &benchReport{}
	r.cpu(cpuSample{client: time.Second, clientOK: true}, cpuSample{client: 2 * time.Second, clientOK: true}, 100)
	require.Nil(t, r.CPU.ServerUSPerJob)
	r = &benchReport{}
	r.cpu(cpuSample{}, cpuSample{}, 100)
	require.Nil(t, r.CPU, "nothing readable, nothing reported")
}

func FuzzPostgresStatCPU(f *testing.F) {
	f.Add("100 (postgres) S 1 100 100 0 -1 0 0 0 0 0 50 20 300 30 20 0 1 0 5 0 0")
	f.Add("1 (postgres) S 1 1 1 0 -1 0 0 0 0 0 68719476735 68719476735 68719476735 68719476735")
	f.Add("1 ((postgres)) S")
	f.Fuzz(func(t *testing.T, stat string) {
		d, isPostgres := postgresStatCPU(stat)
		require.GreaterOrEqual(t, d, time.Duration(0))
		if !isPostgres {
			require.Zero(t, d)
		}
	})
}
