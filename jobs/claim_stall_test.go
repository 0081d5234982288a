package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/jobs"
)

// pausingDB runs a claim whose transaction stops between its two round
// trips, holding its tenants' locks, until resume is closed: a claiming
// process paused mid-claim.
type pausingDB struct {
	*pgxpool.Pool
	paused chan struct{} // closed once the claim holds its locks and waits
	resume chan struct{}
}

func (d *pausingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	return &pausingTx{Tx: tx, db: d}, err
}

type pausingTx struct {
	pgx.Tx
	db    *pausingDB
	trips int
}

func (t *pausingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.trips++
	if t.trips == 2 {
		close(t.db.paused)
		<-t.db.resume
	}
	return t.Tx.SendBatch(ctx, b)
}

// A claimer stalled between its two round trips holds its tenants' locks
// only until Postgres ends its idle transaction (Config.ClaimIdleTimeout):
// other claimers, which skip locked tenants, then reach that tenant's work;
// the stalled claim fails when it wakes, and claims nothing.
func TestStalledClaimReleasesItsTenants(t *testing.T) {
	t.Parallel()
	db := dbtest.Setup(t)
	store, err := jobs.NewStore(jobs.Config{Schema: db.Schema, ClaimIdleTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	ctx := t.Context()
	for range 3 {
		_, err := store.Enqueue(ctx, db.Pool, jobs.EnqueueParams{Tenant: "acme", Kind: "k", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	params := jobs.ClaimParams{Queue: jobs.DefaultQueue, Kinds: []string{"k"}, Limit: 10, LeaseDuration: time.Minute}

	stalled := &pausingDB{Pool: db.Pool, paused: make(chan struct{}), resume: make(chan struct{})}
	stalledErr := make(chan error, 1)
	go func() {
		p := params
		p.Worker = "stalled"
		claimed, err := store.Claim(ctx, stalled, p)
		if err == nil && len(claimed) > 0 {
			err = fmt.Errorf("the stalled claim took %d jobs", len(claimed))
		}
		stalledErr <- err
	}()
	<-stalled.paused
	var resumeOnce sync.Once
	resume := func() { resumeOnce.Do(func() { close(stalled.resume) }) }
	defer resume() // even when the test fails: the schema is dropped after

	var got []*jobs.Job
	require.Eventually(t, func() bool {
		p := params
		p.Worker = "healthy"
		claimed, err := store.Claim(ctx, db.Pool, p)
		require.NoError(t, err)
		got = append(got, claimed...)
		return len(got) == 3
	}, 10*time.Second, 20*time.Millisecond, "the stalled claim's tenant stayed locked")

	resume()
	require.Error(t, <-stalledErr, "the stalled claim's session was ended")
}
