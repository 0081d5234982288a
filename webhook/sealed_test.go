package webhook_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	"github.com/llmq/llmq/webhook"
)

// sealing is a fixture's schema seen through a store with a sealer, and an
// endpoint that answers 204 only to deliveries signed with its key.
type sealing struct {
	*fixture
	sealed   *webhook.Store
	verified atomic.Int32
}

func setupSealing(t *testing.T) *sealing {
	t.Helper()
	f := setup(t)
	sealed, err := webhook.NewStore(webhook.Config{
		Schema: f.schema, Jobs: f.jobs, Outbox: f.outbox, AllowHTTP: true, Allow: loopback,
		Schedule: slices.Repeat([]time.Duration{20 * time.Millisecond}, 10), Sealer: newSealer(t),
	})
	require.NoError(t, err)
	return &sealing{fixture: f, sealed: sealed}
}

// register registers a verifying endpoint through store.
func (s *sealing) register(store *webhook.Store) (*webhook.Endpoint, webhook.Key) {
	s.t.Helper()
	var verifier atomic.Pointer[webhook.Verifier]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := new(bytes.Buffer)
		_, _ = body.ReadFrom(r.Body)
		if v := verifier.Load(); v != nil {
			if _, err := v.Verify(r.Header, body.Bytes()); err == nil {
				s.verified.Add(1)
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	s.t.Cleanup(srv.Close)
	ep, key, err := store.RegisterEndpoint(s.t.Context(), s.pool, webhook.EndpointParams{
		Tenant: tenant, URL: srv.URL + "/hook", EventTypes: []string{webhook.AllEvents},
	})
	require.NoError(s.t, err)
	v, err := webhook.NewVerifier(webhook.VerifierConfig{Keys: []webhook.Key{key}})
	require.NoError(s.t, err)
	verifier.Store(v)
	return ep, key
}

// storedSecret reads a key's secret column as stored.
func (s *sealing) storedSecret(endpoint uuid.UUID) (secret []byte, sealed bool) {
	s.t.Helper()
	require.NoError(s.t, s.pool.QueryRow(s.t.Context(),
		"SELECT secret, sealed FROM "+s.schema+".webhook_endpoint_keys WHERE endpoint_id = $1", endpoint).Scan(&secret, &sealed))
	return secret, sealed
}

func (s *sealing) runWith(store *webhook.Store) func() {
	s.t.Helper()
	d, err := store.NewDispatcher(s.pool, webhook.DispatcherConfig{Client: s.client})
	require.NoError(s.t, err)
	return s.start(runnerConfig(map[string]lease.Handler{webhook.Kind: d}))
}

// With a Sealer, a secret is stored sealed, never raw; a host without the
// sealer cannot sign with it (its attempts fail with ErrSealed's message and
// send nothing); a host with it signs as usual.
func TestSealedSecretsAreStoredSealedAndSign(t *testing.T) {
	t.Parallel()
	s := setupSealing(t)
	ep, key := s.register(s.sealed)
	stored, sealed := s.storedSecret(ep.ID)
	require.True(t, sealed)
	require.False(t, bytes.Contains(stored, key.Secret), "the raw secret is not in the database")

	d := s.enqueue(webhook.Event{})[0]
	stop := s.runWith(s.store) // no sealer
	require.Eventually(t, func() bool {
		attempts, err := s.jobs.Attempts(t.Context(), s.pool, tenant, d.JobID)
		require.NoError(t, err)
		return len(attempts) > 0 && strings.Contains(attempts[0].Error, "is sealed and webhook.Config.Sealer is not set")
	}, 10*time.Second, 10*time.Millisecond)
	stop()
	require.Empty(t, s.attempts(d.ID), "nothing was sent")

	s.runWith(s.sealed)
	require.Equal(t, jobs.StateSucceeded, s.await(d.JobID).State)
	require.Equal(t, int32(1), s.verified.Load(), "delivered with a signature the endpoint's key verifies")

	rotated, err := s.sealed.RotateSecret(t.Context(), s.pool, tenant, ep.ID, time.Hour)
	require.NoError(t, err)
	var raw int
	require.NoError(t, s.pool.QueryRow(t.Context(),
		"SELECT count(*) FROM "+s.schema+".webhook_endpoint_keys WHERE key_id = $1 AND (NOT sealed OR position($2 in secret) > 0)", rotated.ID, rotated.Secret).Scan(&raw))
	require.Zero(t, raw, "a rotated secret is sealed too")
}

// SealSecrets seals the secrets stored raw before a sealer was set, once;
// deliveries then sign with them as before.
func TestSealSecretsSealsRawSecrets(t *testing.T) {
	t.Parallel()
	s := setupSealing(t)
	ep, key := s.register(s.store) // stored raw
	stored, sealed := s.storedSecret(ep.ID)
	require.False(t, sealed)
	require.Equal(t, key.Secret, stored)

	_, err := s.store.SealSecrets(t.Context(), s.pool)
	require.ErrorIs(t, err, webhook.ErrInvalidConfig, "sealing needs a sealer")
	n, err := s.sealed.SealSecrets(t.Context(), s.pool)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	n, err = s.sealed.SealSecrets(t.Context(), s.pool)
	require.NoError(t, err)
	require.Zero(t, n, "already sealed")
	stored, sealed = s.storedSecret(ep.ID)
	require.True(t, sealed)
	require.False(t, bytes.Contains(stored, key.Secret))

	d := s.enqueue(webhook.Event{})[0]
	s.runWith(s.sealed)
	require.Equal(t, jobs.StateSucceeded, s.await(d.JobID).State)
	require.Equal(t, int32(1), s.verified.Load())
}
