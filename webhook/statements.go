package webhook

import (
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/internal/dbsql"
)

// statements is every statement of queries.sql and prune.sql, with the
// shape the code binds and scans; dbsqltest checks it against the schema.
type statements struct {
	insertEndpoint, insertKey, expireKeys, lockEndpoint, getEndpoint, listEndpoints, setStatus string
	subscribed, insertDeliveries, getDelivery, loadAttempt                                     string
	breakerAdmit, breakerSuccess, breakerFailure, authFailure, insertAttempt, listAttempts     string
	pruneDeliveries, breakerStates, rawKeys, sealKeys                                          string
	countDeliveries, oldestDelivery                                                            string // prune.sql
}

func (q *statements) load(schema dbsql.Schema) (dbsql.Set, error) {
	return dbsql.Load(schema, []string{queriesSQL, pruneSQL},
		dbsql.Exec(&q.insertEndpoint, "InsertEndpoint", 7),
		dbsql.Exec(&q.insertKey, "InsertKey", 4),
		dbsql.Exec(&q.expireKeys, "ExpireKeys", 3),
		dbsql.Query(&q.lockEndpoint, "LockEndpoint", 2, new(uuid.UUID)),
		dbsql.Query(&q.getEndpoint, "GetEndpoint", 2, new(endpointRow).dest()...),
		dbsql.Query(&q.listEndpoints, "ListEndpoints", 1, new(endpointRow).dest()...),
		dbsql.Exec(&q.setStatus, "SetStatus", 4),
		dbsql.Query(&q.subscribed, "SubscribedEndpoints", 2, new(uuid.UUID)),
		dbsql.Query(&q.insertDeliveries, "InsertDeliveries", 6, new(uuid.UUID), new(uuid.UUID)),
		dbsql.Query(&q.getDelivery, "GetDelivery", 2, deliveryDest(new(Delivery))...),
		dbsql.Query(&q.loadAttempt, "LoadAttempt", 2, new(targetRow).dest()...),
		dbsql.Query(&q.breakerAdmit, "BreakerAdmit", 3, new(string), new(*time.Time), new(bool), new(time.Time)),
		dbsql.Exec(&q.breakerSuccess, "BreakerSuccess", 2),
		dbsql.Discard(&q.breakerFailure, "BreakerFailure", 4),
		dbsql.Query(&q.authFailure, "AuthFailure", 2, new(int)),
		dbsql.Exec(&q.insertAttempt, "InsertAttempt", 14),
		dbsql.Query(&q.listAttempts, "ListAttempts", 2, new(attemptRow).dest()...),
		dbsql.Exec(&q.pruneDeliveries, "PruneDeliveries", 2),
		dbsql.Query(&q.breakerStates, "BreakerStates", 0, new(string), new(int64)),
		dbsql.Query(&q.rawKeys, "RawKeys", 1, new(uuid.UUID), new(string), new([]byte)),
		dbsql.Exec(&q.sealKeys, "SealKeys", 3),
		dbsql.Query(&q.countDeliveries, "CountDeliveries", 1, new(int64)),
		dbsql.Query(&q.oldestDelivery, "OldestDelivery", 0, new(*time.Time)),
	)
}

// endpointRow is an endpoint_columns row as scanned.
type endpointRow struct {
	ep                      Endpoint
	scheme, status, breaker string
	until                   *time.Time
}

func (r *endpointRow) dest() []any {
	ep := &r.ep
	return []any{&ep.ID, &ep.Tenant, &ep.URL, &ep.EventTypes, &r.scheme, &ep.SendKeyIDs, &ep.Description, &r.status,
		&ep.DisabledReason, &r.breaker, &ep.BreakerFails, &r.until, &ep.AuthFailures, &ep.CreatedAt, &ep.UpdatedAt, &ep.KeyIDs}
}

func deliveryDest(d *Delivery) []any {
	return []any{&d.ID, &d.Tenant, &d.EndpointID, &d.EventID, &d.EventType, &d.Body, &d.CreatedAt}
}

// targetRow is a LoadAttempt row as scanned.
type targetRow struct {
	t                       attemptTarget
	scheme, status, breaker string
	keyIDs                  []string
	secrets                 [][]byte
	sealed                  []bool
}

func (r *targetRow) dest() []any {
	return []any{&r.t.endpointID, &r.t.body, &r.t.url, &r.scheme, &r.t.sendKeyIDs, &r.status, &r.breaker, &r.t.breakerTill,
		&r.keyIDs, &r.secrets, &r.sealed}
}

// attemptRow is a ListAttempts row as scanned.
type attemptRow struct {
	a      Attempt
	status *int
	ms     float64
}

func (r *attemptRow) dest() []any {
	a := &r.a
	return []any{&a.DeliveryID, &a.JobID, &a.Attempt, &a.Worker, &a.URL, &a.StartedAt, &r.ms, &r.status, &a.Outcome,
		&a.ErrorClass, &a.Error, &a.KeyIDs, &a.RequestHeaders, &a.ResponseBody}
}
