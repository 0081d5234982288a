package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// benchReport is what a drain, e2e, latency, relay or ingress bench found. As
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
	Relay         *relayReport   `json:"relay,omitempty"`
	// CPU is the timed phase's CPU per job (drain and e2e).
	CPU *cpuReport `json:"cpu,omitempty"`
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
	at := func(q float64) float64 {
		return float64(percentile(ds, q).Round(10*time.Microsecond)) / float64(time.Millisecond)
	}
	return durationSummary{N: len(ds), P50Ms: at(0.50), P90Ms: at(0.90), P99Ms: at(0.99), MaxMs: at(1)}
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
	// The summary line stays the last: scripts read it.
	if r.CPU != nil {
		if err := r.CPU.print(r.out); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(r.out, "llmq %s jobs=%d workers=%d seconds=%.3f jobs_per_s=%.0f\n", r.Mode, r.Jobs, r.Workers, r.Seconds, r.JobsPerSecond)
	return err
}

// relayReport is a relay bench's finding: the timed run of the relay fleet
// (the memory broker's mode), or, with RabbitMQ, the relays' rate against
// the broker's raw confirmed publishing.
type relayReport struct {
	Fleet    *relayFleetReport `json:"fleet,omitempty"`
	RabbitMQ *rabbitMQReport   `json:"rabbitmq,omitempty"`
}

// relayFleetReport is one timed run of the relay fleet.
type relayFleetReport struct {
	Relays                   int     `json:"relays"`
	As                       string  `json:"as"` // processes or goroutines
	Active                   string  `json:"active"`
	Events                   int     `json:"events"`
	Seconds                  float64 `json:"seconds"`
	EventsPerSecond          float64 `json:"events_per_s"`
	TakeoverAfterFreeSeconds float64 `json:"takeover_after_free_s"`
	// PeakConnections is sampled when the relays are processes.
	PeakConnections *relayPeaks `json:"peak_connections,omitempty"`
	// CPU is read from /proc when the relays are processes; CPUUnreadable
	// says /proc could not be read.
	CPU           *relayCPUReport `json:"cpu,omitempty"`
	CPUUnreadable bool            `json:"cpu_unreadable,omitempty"`
	Timed         string          `json:"timed"`
}

type relayPeaks struct {
	ActiveRelay   int `json:"active_relay"`
	ActiveBudget  int `json:"active_relay_budget"`
	StandbyRelay  int `json:"standby_relay"`
	StandbyBudget int `json:"standby_relay_budget"`
	AllRelays     int `json:"all_relays"`
}

// relayCPUReport is the CPU the relay processes used from the lease's
// release to the drained backlog: the active relay's, the standbys'
// together, and theirs as a share of the window (100 = one core).
type relayCPUReport struct {
	ActiveRelaySeconds   float64 `json:"active_relay_s"`
	StandbyRelaysSeconds float64 `json:"standby_relays_s"`
	StandbyCorePercent   float64 `json:"standby_core_pct"`
	WindowSeconds        float64 `json:"window_s"`
}

// print writes the run as one line.
func (f relayFleetReport) print(w io.Writer) {
	fmt.Fprintf(w, "llmq relay fleet: relays=%d as=%s active=%s events=%d seconds=%.3f events_per_s=%.0f takeover_after_free_s=%.2f",
		f.Relays, f.As, f.Active, f.Events, f.Seconds, f.EventsPerSecond, f.TakeoverAfterFreeSeconds)
	if p := f.PeakConnections; p != nil {
		fmt.Fprintf(w, " peak_connections: active_relay=%d (budget %d) standby_relay=%d (budget %d) all_relays=%d",
			p.ActiveRelay, p.ActiveBudget, p.StandbyRelay, p.StandbyBudget, p.AllRelays)
	} else {
		fmt.Fprint(w, " peak_connections: not sampled (the relays share this process's pool)")
	}
	switch c := f.CPU; {
	case f.CPUUnreadable:
		fmt.Fprint(w, " cpu: not readable (no /proc)")
	case c != nil:
		fmt.Fprintf(w, " cpu_s: active_relay=%.2f standby_relays=%.2f (%.1f%% of a core over %.1fs)",
			c.ActiveRelaySeconds, c.StandbyRelaysSeconds, c.StandbyCorePercent, c.WindowSeconds)
	}
	fmt.Fprintf(w, " timed=%s, all %d relays started and standing by\n", f.Timed, f.Relays)
}

// rabbitMQReport is the relays' rate against RabbitMQ's raw confirmed
// publishing, over relayRounds rounds.
type rabbitMQReport struct {
	Window                int       `json:"window"`
	Relays                int       `json:"relays"`
	RawConfirmedPerSecond float64   `json:"raw_confirmed_per_s"`
	RelayPerSecond        float64   `json:"relay_per_s"`
	RelayToRaw            float64   `json:"relay_to_raw"`
	Rounds                []float64 `json:"rounds_relay_to_raw"`
	// PublishShare is the share of the relays' time spent publishing.
	PublishShare float64 `json:"publish_share"`
}

func (r rabbitMQReport) print(w io.Writer) {
	rounds := make([]string, len(r.Rounds))
	for i, x := range r.Rounds {
		rounds[i] = fmt.Sprintf("%.2f", x)
	}
	fmt.Fprintf(w, "llmq relay broker=rabbitmq window=%d relays=%d raw_confirmed_per_s=%.0f relay_per_s=%.0f relay_to_raw=%.2f (rounds %s) publish_share=%.2f\n",
		r.Window, r.Relays, r.RawConfirmedPerSecond, r.RelayPerSecond, r.RelayToRaw, strings.Join(rounds, " "), r.PublishShare)
}

// relayFleet adds the fleet's run.
func (r *benchReport) relayFleet(f relayFleetReport) {
	if r.asJSON {
		r.relay().Fleet = &f
		return
	}
	f.print(r.out)
}

// rabbitMQ adds the RabbitMQ rounds' finding.
func (r *benchReport) rabbitMQ(q rabbitMQReport) {
	if r.asJSON {
		r.relay().RabbitMQ = &q
		return
	}
	q.print(r.out)
}

func (r *benchReport) relay() *relayReport {
	if r.Relay == nil {
		r.Relay = &relayReport{}
	}
	return r.Relay
}
