package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"
)

// benchReport is what a drain, e2e, latency or ingress bench found. As
// text, each part is printed as soon as it is known, one key=value line
// each; with -json, the whole report is printed as one JSON object when
// the bench ends, so a script reads one value per run.
type benchReport struct {
	asJSON bool
	out    io.Writer

	Mode          string         `json:"mode"`
	Jobs          int            `json:"jobs"`
	Workers       int            `json:"workers"`
	Seconds       float64        `json:"seconds"`
	JobsPerSecond float64        `json:"jobs_per_s"`
	WAL           []walLine      `json:"wal,omitempty"`
	Latency       *latencyReport `json:"latency,omitempty"`
}

// walLine is the WAL one phase (or one relation's share of it) wrote per
// job. The record figures are there when the records were read back
// (pg_walinspect).
type walLine struct {
	Phase       string  `json:"phase"`
	Relation    string  `json:"relation,omitempty"`
	Jobs        int     `json:"jobs"`
	BytesPerJob float64 `json:"bytes_per_job"`
	*walRecordsPerJob
}

type walRecordsPerJob struct {
	SchemaBytes  float64 `json:"schema_bytes_per_job"`
	Records      float64 `json:"records_per_job"`
	FPIBytes     float64 `json:"fpi_bytes_per_job"`
	HeapInserts  float64 `json:"heap_inserts_per_job"`
	Updates      float64 `json:"updates_per_job"`
	HOTPercent   float64 `json:"hot_pct"`
	Locks        float64 `json:"locks_per_job"`
	Deletes      float64 `json:"deletes_per_job"`
	IndexEntries float64 `json:"index_entries_per_job"`
}

// latencyReport is the latency mode's finding: from each enqueue call to
// its handler's start, and how long the enqueue call itself took.
type latencyReport struct {
	RatePerSecond  float64         `json:"rate_per_s"`
	EnqueueToStart durationSummary `json:"enqueue_to_start"`
	EnqueueCall    durationSummary `json:"enqueue_call"`
}

// durationSummary gives percentiles of a set of durations in milliseconds,
// rounded to 10µs.
type durationSummary struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50_ms"`
	P90Ms float64 `json:"p90_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
}

// summarize sorts ds in place and summarizes it.
func summarize(ds []time.Duration) durationSummary {
	if len(ds) == 0 {
		return durationSummary{}
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 {
		return float64(d.Round(10*time.Microsecond)) / float64(time.Millisecond)
	}
	at := func(q float64) float64 { return ms(ds[min(len(ds)-1, int(q*float64(len(ds))))]) }
	return durationSummary{N: len(ds), P50Ms: at(0.50), P90Ms: at(0.90), P99Ms: at(0.99), MaxMs: ms(ds[len(ds)-1])}
}

func (s durationSummary) String() string {
	if s.N == 0 {
		return "n=0"
	}
	d := func(v float64) time.Duration {
		return time.Duration(v * float64(time.Millisecond)).Round(10 * time.Microsecond)
	}
	return fmt.Sprintf("p50=%s p90=%s p99=%s max=%s", d(s.P50Ms), d(s.P90Ms), d(s.P99Ms), d(s.MaxMs))
}

// wal adds the lines of one phase: printed now as text, kept for the end
// with -json.
func (r *benchReport) wal(lines ...walLine) {
	if r.asJSON {
		r.WAL = append(r.WAL, lines...)
		return
	}
	for _, l := range lines {
		l.print(r.out)
	}
}

// print writes l as one line:
//
//	llmq wal phase=P [relation=R] jobs=N bytes_per_job=B [schema_bytes_per_job=… records_per_job=… fpi_bytes_per_job=…
//	    heap_inserts_per_job=… updates_per_job=… hot_pct=… locks_per_job=… deletes_per_job=… index_entries_per_job=…]
func (l walLine) print(w io.Writer) {
	fmt.Fprintf(w, "llmq wal phase=%s", l.Phase)
	if l.Relation != "" {
		fmt.Fprintf(w, " relation=%s", l.Relation)
	}
	fmt.Fprintf(w, " jobs=%d bytes_per_job=%.0f", l.Jobs, l.BytesPerJob)
	if r := l.walRecordsPerJob; r != nil {
		fmt.Fprintf(w, " schema_bytes_per_job=%.0f records_per_job=%.1f fpi_bytes_per_job=%.0f heap_inserts_per_job=%.2f updates_per_job=%.2f hot_pct=%.0f locks_per_job=%.2f deletes_per_job=%.2f index_entries_per_job=%.2f",
			r.SchemaBytes, r.Records, r.FPIBytes, r.HeapInserts, r.Updates, r.HOTPercent, r.Locks, r.Deletes, r.IndexEntries)
	}
	fmt.Fprintln(w)
}

// latency adds the latency mode's finding.
func (r *benchReport) latency(l latencyReport) {
	if r.asJSON {
		r.Latency = &l
		return
	}
	fmt.Fprintf(r.out, "llmq latency rate=%.0f/s enqueue_to_start %s\n", l.RatePerSecond, l.EnqueueToStart)
	fmt.Fprintf(r.out, "llmq latency rate=%.0f/s enqueue_call     %s\n", l.RatePerSecond, l.EnqueueCall)
}

// finish records the timed part's length and prints the last line, or the
// whole report with -json.
func (r *benchReport) finish(seconds float64) error {
	r.Seconds = seconds
	r.JobsPerSecond = float64(r.Jobs) / seconds
	if r.asJSON {
		return json.NewEncoder(r.out).Encode(r)
	}
	_, err := fmt.Fprintf(r.out, "llmq %s jobs=%d workers=%d seconds=%.3f jobs_per_s=%.0f\n", r.Mode, r.Jobs, r.Workers, r.Seconds, r.JobsPerSecond)
	return err
}
