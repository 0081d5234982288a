package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmq/llmq/examples/invoice"
)

// apiClient is a tenant's view of the API, over HTTP.
type apiClient struct {
	base, token string
}

// reply is a response, read in full.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

func (c apiClient) do(ctx context.Context, method, path string, header http.Header, body []byte) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header = header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

func (c apiClient) putDocument(ctx context.Context, name, text string) (invoice.Document, error) {
	resp, err := c.do(ctx, http.MethodPut, "/documents/"+name, nil, []byte(text))
	if err != nil {
		return invoice.Document{}, err
	}
	if resp.Status != http.StatusCreated {
		return invoice.Document{}, fmt.Errorf("PUT document %s: %d: %s", name, resp.Status, resp.Body)
	}
	var d invoice.Document
	err = json.Unmarshal(resp.Body, &d)
	return d, err
}

// submitted is the answer to one POST /extraction-jobs.
type submitted struct {
	Status     int
	RetryAfter string
	Location   string
	Job        invoice.JobView
	Body       []byte
}

func (c apiClient) submit(ctx context.Context, key string, doc invoice.Document) (submitted, error) {
	return c.submitBy(ctx, key, doc, time.Time{})
}

// submitBy submits doc needed by neededBy (zero: no deadline).
func (c apiClient) submitBy(ctx context.Context, key string, doc invoice.Document, neededBy time.Time) (submitted, error) {
	body, err := json.Marshal(invoice.CreateRequest{Document: doc, Schema: invoice.SchemaV1, NeededBy: neededBy})
	if err != nil {
		return submitted{}, err
	}
	return c.submitRaw(ctx, key, body)
}

func (c apiClient) submitRaw(ctx context.Context, key string, body []byte) (submitted, error) {
	h := http.Header{"Content-Type": {"application/json"}}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	resp, err := c.do(ctx, http.MethodPost, "/extraction-jobs", h, body)
	if err != nil {
		return submitted{}, err
	}
	s := submitted{Status: resp.Status, RetryAfter: resp.Header.Get("Retry-After"), Location: resp.Header.Get("Location"), Body: resp.Body}
	if resp.Status == http.StatusOK || resp.Status == http.StatusAccepted {
		err = json.Unmarshal(resp.Body, &s.Job)
	}
	return s, err
}

func (c apiClient) get(ctx context.Context, path string) (int, invoice.JobView, error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return 0, invoice.JobView{}, err
	}
	var v invoice.JobView
	if resp.Status == http.StatusOK {
		err = json.Unmarshal(resp.Body, &v)
	}
	return resp.Status, v, err
}

// uploaded is the answer to one POST /extraction-batches.
type uploaded struct {
	Status   int
	Location string
	Batch    invoice.BatchView
	Body     []byte
}

func (c apiClient) uploadBatch(ctx context.Context, key string, docs []invoice.Document) (uploaded, error) {
	body, err := json.Marshal(invoice.BatchRequest{Documents: docs, Schema: invoice.SchemaV1})
	if err != nil {
		return uploaded{}, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/extraction-batches", http.Header{"Idempotency-Key": {key}}, body)
	if err != nil {
		return uploaded{}, err
	}
	u := uploaded{Status: resp.Status, Location: resp.Header.Get("Location"), Body: resp.Body}
	if resp.Status == http.StatusOK || resp.Status == http.StatusAccepted {
		err = json.Unmarshal(resp.Body, &u.Batch)
	}
	return u, err
}

func (c apiClient) getBatch(ctx context.Context, path string) (int, invoice.BatchView, error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil, nil)
	if err != nil {
		return 0, invoice.BatchView{}, err
	}
	var v invoice.BatchView
	if resp.Status == http.StatusOK {
		err = json.Unmarshal(resp.Body, &v)
	}
	return resp.Status, v, err
}

// sseEvent is one server-sent event: Data holds a job.changed event's
// data, Batch a batch.progress or batch.completed event's.
type sseEvent struct {
	ID, Event string
	Data      invoice.Notification
	Batch     invoice.BatchNotification
	Raw       string
}

// stream opens the tenant's event stream (after lastID, if set) and sends
// its events on the returned channel until ctx ends or the server closes it.
func (c apiClient) stream(ctx context.Context, lastID string) (<-chan sseEvent, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/extraction-jobs/events", http.NoBody)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("events: %s", resp.Status)
	}
	out := make(chan sseEvent, 1000)
	go readEvents(ctx, resp.Body, out)
	return out, nil
}

// readEvents parses server-sent events from body onto out until body ends.
func readEvents(ctx context.Context, body io.ReadCloser, out chan<- sseEvent) {
	defer close(out)
	defer body.Close()
	sc := bufio.NewScanner(body)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.Event != "" {
				switch {
				case ev.Event == "job.changed":
					_ = json.Unmarshal([]byte(ev.Raw), &ev.Data)
				case strings.HasPrefix(ev.Event, "batch."):
					_ = json.Unmarshal([]byte(ev.Raw), &ev.Batch)
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.Event = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.Raw = line[6:]
		}
	}
}
