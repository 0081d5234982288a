package invoice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/jobs"
)

// Stream settings. DefaultReplayWindow bounds what a reconnect replays: a
// client further behind is told to re-read the snapshot (GET
// /extraction-jobs).
const (
	DefaultReplayWindow  = 1000
	streamPoll           = 200 * time.Millisecond
	defaultStreamGapWait = 2 * time.Second
	streamKeepalive      = 15 * time.Second
	streamWriteTimeout   = 2 * streamKeepalive // for each write of a stream
	streamBatch          = 500
	maxTracked           = 10_000 // jobs whose last state_version a stream remembers
)

// Notification is one "job changed" event on the stream. It says which job
// changed and to which state version, and the upload it belongs to if
// any; GET the job for the rest.
type Notification struct {
	EventID      string `json:"event_id"`
	Type         string `json:"type"`
	JobID        string `json:"job_id"`
	State        string `json:"state"`
	StateVersion int64  `json:"state_version"`
	BatchID      string `json:"batch_id,omitempty"`
}

// BatchNotification is an upload's progress on the stream. A
// "batch.progress" event follows job events that finished some of the
// upload's jobs, with its counts as read then (so possibly ahead of the
// job events sent so far, never behind them); "batch.completed" comes
// once, from the event the job store wrote when the last job finished.
type BatchNotification struct {
	EventID        string `json:"event_id,omitempty"` // batch.completed only: the outbox event
	Type           string `json:"type"`
	BatchID        string `json:"batch_id"`
	Done           bool   `json:"done"`
	Total          int    `json:"total"`
	Finished       int    `json:"finished"`
	Succeeded      int    `json:"succeeded"`
	ReviewRequired int    `json:"review_required"`
	Failed         int    `json:"failed"`
	Cancelled      int    `json:"cancelled"`
	PercentDone    int    `json:"percent_done"`
}

type outboxRow struct {
	seq                                               int64
	eventID, topic, typ, job, tenant, kind, st, batch string
	version                                           int64
	body                                              []byte // batch.completed events only
}

// events streams the caller's tenant's job events as server-sent events. The
// SSE id is the outbox sequence number, an opaque cursor: a reconnect with
// Last-Event-ID replays what followed it, up to Config.ReplayWindow of the tenant's
// events; a cursor that fell out of the outbox (published events are
// pruned) or is further behind than that gets a "reset" event, after which
// the client re-reads the snapshot and the stream goes on from now. A
// sequence number whose transaction has not committed yet holds the stream
// back, so events are not skipped past: until every transaction that was in
// progress when the gap was seen has ended (a rolled-back acceptance leaves
// a gap for good), and never longer than Config.StreamGapWait.
//
// Only lifecycle events the job store writes reach the stream: acceptance,
// a retry being scheduled, and the terminal states. A claim writes no event
// (it would cost a write per attempt), so RUNNING is visible in GET only.
//
// Uploads (POST /extraction-batches) show on the same stream: after the
// job events of one read that finished jobs of an upload, a
// "batch.progress" event with the upload's counts (one primary-key probe
// per upload and read, not per job), and "batch.completed" once when it
// is done. Progress events carry the id of the last event before them, so
// a reconnect replays the job events and the progress they imply.
func (s *Service) events(w http.ResponseWriter, r *http.Request, token string, c Credential) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.internalError(w, r, "unsupported", errors.New("the response writer cannot flush: streaming unsupported"))
		return
	}
	ctx := r.Context()
	newest, oldest, err := s.seqBounds(ctx)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	cursor, reset := newest, ""
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		n, err := strconv.ParseInt(last, 10, 64)
		switch {
		case err != nil || n < 0 || n > newest:
			reset = "unknown cursor"
		case oldest > 0 && n+1 < oldest:
			reset = "cursor older than the retained events"
		default:
			behind, err := s.countBehind(ctx, c.Tenant, n, newest)
			if err != nil {
				s.unavailable(w, r, err)
				return
			}
			if behind > s.cfg.ReplayWindow {
				reset = "more than the replay window behind"
			} else {
				cursor = n
			}
		}
	}
	// A stream outlives the server's write timeout, which is for responses
	// that end: each of its writes gets a deadline of its own instead, so a
	// client that stops reading is dropped after streamWriteTimeout, not
	// held for ever. (The read timeout does not reach it: once a request
	// without a body has been read, net/http clears the read deadline.)
	rc := http.NewResponseController(w)
	writeDeadline := func() {
		if err := rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			s.cfg.Logger.Warn("invoice events: setting the write deadline", "err", err)
		}
	}
	writeDeadline()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if reset != "" {
		fmt.Fprintf(w, "id: %d\nevent: reset\ndata: {\"reason\":%q,\"snapshot_url\":\"/extraction-jobs\"}\n\n", cursor, reset)
	} else {
		fmt.Fprint(w, ": stream open\n\n")
	}
	flusher.Flush()

	sent := map[string]int64{}   // newest state_version sent per job
	progress := map[string]int{} // most finished jobs sent per upload
	var (
		gapSince    time.Time
		gapSnapshot string // the transactions in progress when the gap was first seen
	)
	tick := time.NewTicker(streamPoll)
	defer tick.Stop()
	lastWrite := time.Now()
	for {
		if _, ok := s.cfg.Auth.Lookup(token); !ok {
			fmt.Fprint(w, "event: revoked\ndata: {}\n\n")
			flusher.Flush()
			return
		}
		// Checked before the read: if every transaction that could hold
		// the missing sequence numbers had ended by now, the read below
		// sees whichever of them committed, and what is still missing was
		// rolled back (a refused acceptance, for one) and never comes.
		gapSettled := false
		if gapSnapshot != "" {
			if err := s.pool.QueryRow(ctx, s.q["SnapshotSettled"], gapSnapshot).Scan(&gapSettled); err != nil {
				s.streamEnded(ctx, err)
				return
			}
		}
		rows, err := s.eventsAfter(ctx, cursor)
		if err != nil {
			s.streamEnded(ctx, err)
			return
		}
		var touched []string // uploads whose jobs finished in this read, in order
		for _, row := range rows {
			if row.seq != cursor+1 && !gapSettled {
				if gapSince.IsZero() {
					gapSince = time.Now()
					if err := s.pool.QueryRow(ctx, s.q["CurrentSnapshot"]).Scan(&gapSnapshot); err != nil {
						s.streamEnded(ctx, err)
						return
					}
				}
				if time.Since(gapSince) < s.cfg.StreamGapWait {
					break // an earlier event may still commit
				}
			}
			gapSince, gapSnapshot, gapSettled = time.Time{}, "", false
			cursor = row.seq
			if row.topic != s.Jobs.Config().EventTopic || row.tenant != c.Tenant {
				continue
			}
			if row.typ == jobs.BatchCompletedEvent {
				var b batchCompleted
				if err := json.Unmarshal(row.body, &b); err != nil {
					s.streamEnded(ctx, fmt.Errorf("event %s: %w", row.eventID, err))
					return
				}
				data, _ := json.Marshal(BatchNotification{
					EventID: row.eventID, Type: row.typ, BatchID: b.BatchID.String(), Done: true, Total: b.Total, Finished: b.Total,
					Succeeded: b.Succeeded, ReviewRequired: b.ReviewRequired, Failed: b.Failed, Cancelled: b.Cancelled, PercentDone: 100,
				})
				fmt.Fprintf(w, "id: %d\nevent: batch.completed\ndata: %s\n\n", row.seq, data)
				lastWrite = time.Now()
				progress[b.BatchID.String()] = b.Total // nothing follows its end
				continue
			}
			if row.kind != Kind || row.version <= sent[row.job] {
				continue
			}
			if len(sent) >= maxTracked {
				// A job's events are written in order under its row lock,
				// so this map only guards; keep it bounded on long streams.
				clear(sent)
			}
			sent[row.job] = row.version
			data, _ := json.Marshal(Notification{EventID: row.eventID, Type: row.typ, JobID: row.job, State: row.st, StateVersion: row.version, BatchID: row.batch})
			fmt.Fprintf(w, "id: %d\nevent: job.changed\ndata: %s\n\n", row.seq, data)
			lastWrite = time.Now()
			if row.batch != "" && jobs.State(row.st).Terminal() && !slices.Contains(touched, row.batch) {
				touched = append(touched, row.batch)
			}
		}
		for _, id := range touched {
			if err := s.sendProgress(ctx, w, c.Tenant, id, cursor, progress); err != nil {
				s.streamEnded(ctx, err)
				return
			}
			lastWrite = time.Now()
		}
		if time.Since(lastWrite) > streamKeepalive {
			fmt.Fprint(w, ": keepalive\n\n")
			lastWrite = time.Now()
		}
		writeDeadline()
		flusher.Flush()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sendProgress writes upload id's "batch.progress" event, read now, unless
// no more of its jobs have finished than the stream last sent; sent holds
// those counts, bounded like the stream's job versions.
func (s *Service) sendProgress(ctx context.Context, w io.Writer, tenant, id string, cursor int64, sent map[string]int) error {
	batchID, err := uuid.Parse(id)
	if err != nil {
		return fmt.Errorf("an event's batch_id %q: %w", id, err)
	}
	b, err := s.Jobs.Batch(ctx, s.pool, tenant, batchID)
	if errors.Is(err, jobs.ErrNotFound) {
		return nil // pruned since
	}
	if err != nil {
		return err
	}
	if b.Finished <= sent[id] {
		return nil
	}
	if len(sent) >= maxTracked {
		clear(sent)
	}
	sent[id] = b.Finished
	v := batchView(b)
	data, _ := json.Marshal(BatchNotification{
		Type: "batch.progress", BatchID: id, Done: v.Done, Total: v.Total, Finished: v.Finished, Succeeded: v.Succeeded,
		ReviewRequired: v.ReviewRequired, Failed: v.Failed, Cancelled: v.Cancelled, PercentDone: v.PercentDone,
	})
	_, err = fmt.Fprintf(w, "id: %d\nevent: batch.progress\ndata: %s\n\n", cursor, data)
	return err
}

// streamEnded logs why a stream stopped reading events, unless its client
// went away (the client reconnects with Last-Event-ID).
func (s *Service) streamEnded(ctx context.Context, err error) {
	if ctx.Err() == nil {
		s.cfg.Logger.Warn("invoice events: the stream ends", "err", err)
	}
}

func (s *Service) seqBounds(ctx context.Context) (newest, oldest int64, err error) {
	err = s.pool.QueryRow(ctx, s.q["MaxEventSeq"]).Scan(&newest, &oldest)
	return newest, oldest, err
}

// countBehind counts the tenant's events between two cursors, reading at
// most ReplayWindow+1 of them.
func (s *Service) countBehind(ctx context.Context, tenant string, from, to int64) (int, error) {
	n := 0
	for from < to && n <= s.cfg.ReplayWindow {
		rows, err := s.eventsAfter(ctx, from)
		if err != nil || len(rows) == 0 {
			return n, err
		}
		for _, r := range rows {
			if r.tenant == tenant && r.kind == Kind {
				n++
			}
			from = r.seq
		}
	}
	return n, nil
}

func (s *Service) eventsAfter(ctx context.Context, cursor int64) ([]outboxRow, error) {
	rows, err := s.pool.Query(ctx, s.q["EventsAfter"], cursor, streamBatch)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var o outboxRow
		if err := rows.Scan(&o.seq, &o.eventID, &o.topic, &o.typ, &o.job, &o.tenant, &o.kind, &o.version, &o.st, &o.batch, &o.body); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, rows.Err()
}
