// Command localbench compares admission by in-flight tokens with admission
// by request count, against package localserver's simulated server. It is
// for choosing how to limit a pool in front of a local inference server: it
// prints each policy's throughput, latencies and preemptions side by side.
//
// A backlog of mixed documents (four in five of 1,000 to 4,000 tokens, one
// in five of 40,000 to 80,000) is sent through an admission.Local limiter by
// many workers, once with the pool's in-flight token budget set to the
// server's KV cache, then with request count limits only: at the token
// budget's mean concurrency, and swept over -sweep to find the best of them.
// Every run starts a fresh server.
//
//	go run ./examples/localserver/cmd/localbench -docs 300 -scale 20
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/localserver"
)

func main() {
	docs := flag.Int("docs", 300, "documents in the backlog")
	kv := flag.Int64("kv-tokens", 200_000, "the server's KV cache in tokens")
	scale := flag.Float64("scale", 20, "divide the server's times by this")
	sweep := flag.String("sweep", "2,4,6,8,12,16,24,32", "request-count limits to try")
	seed := flag.Uint64("seed", 1, "the backlog's seed")
	maxTokens := flag.Int64("max-tokens", 1000, "each call's max_tokens, reserved with its prompt")
	output := flag.Int64("output-tokens", 800, "tokens the server generates for each call (at most -max-tokens)")
	flag.Parse()
	limits, err := parseSweep(*sweep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "localbench:", err)
		os.Exit(2)
	}
	b := bench{docs: *docs, kv: *kv, scale: *scale, seed: *seed, maxTokens: *maxTokens, output: *output}
	if err := b.run(context.Background(), limits); err != nil {
		fmt.Fprintln(os.Stderr, "localbench:", err)
		os.Exit(1)
	}
}

func parseSweep(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sweep: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

type bench struct {
	docs              int
	kv                int64
	scale             float64
	seed              uint64
	maxTokens, output int64
}

// once runs the backlog against a fresh server with pool's limits.
func (b bench) once(ctx context.Context, backlog []localserver.Document, pool admission.Pool) (localserver.BacklogResult, error) {
	s := localserver.New(localserver.Config{KVTokens: b.kv, Scale: b.scale, OutputTokens: b.output})
	defer s.Close()
	srv := httptest.NewServer(s)
	defer srv.Close()
	l, err := admission.NewLocal()
	if err != nil {
		return localserver.BacklogResult{}, err
	}
	if err := l.SetPool(ctx, pool); err != nil {
		return localserver.BacklogResult{}, err
	}
	return localserver.RunBacklog(ctx, s, backlog, localserver.BacklogOptions{URL: srv.URL, Limiter: l, Pool: pool.Name, MaxTokens: b.maxTokens})
}

func (b bench) run(ctx context.Context, limits []int) error {
	docs, kv := b.docs, b.kv
	backlog := localserver.MixedBacklog(docs, b.seed)
	base := admission.Pool{Name: "local", RPM: 1 << 30, TPM: 1 << 50, TokenBurst: 1 << 40, MaxInFlight: 256}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POLICY\tSECONDS\tTOKENS/S\tSHORT P50\tSHORT P99\tLONG P99\tMEAN IN FLIGHT\tPREEMPTIONS")
	row := func(name string, r localserver.BacklogResult) {
		fmt.Fprintf(tw, "%s\t%.2f\t%.0f\t%.2fs\t%.2fs\t%.2fs\t%.1f\t%d\n", name, r.Elapsed.Seconds(), r.TokensPerSecond,
			r.ShortP50.Seconds(), r.ShortP99.Seconds(), r.LongP99.Seconds(), r.MeanInFlight, r.Preemptions)
	}
	budget := base
	budget.MaxInFlightTokens = kv
	fmt.Fprintf(os.Stderr, "localbench: %d documents, KV cache %d tokens, scale %g: the token budget\n", docs, kv, b.scale)
	tok, err := b.once(ctx, backlog, budget)
	if err != nil {
		return err
	}
	row(fmt.Sprintf("in-flight tokens <= %d", kv), tok)
	same := max(1, int(math.Round(tok.MeanInFlight)))
	results := map[int]localserver.BacklogResult{}
	for _, n := range append([]int{same}, limits...) {
		if _, done := results[n]; done {
			continue
		}
		fmt.Fprintf(os.Stderr, "localbench: requests in flight <= %d\n", n)
		p := base
		p.MaxInFlight = n
		r, err := b.once(ctx, backlog, p)
		if err != nil {
			return err
		}
		results[n] = r
		row(fmt.Sprintf("requests in flight <= %d", n), r)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	best := 0 // the request limit of the highest throughput
	for n, r := range results {
		if best == 0 || r.TokensPerSecond > results[best].TokensPerSecond {
			best = n
		}
	}
	fmt.Printf("llmq local short_p99_ratio=%.2f (token budget / request limit %d, the same mean concurrency) throughput_ratio=%.2f (token budget / best request limit, %d) preemptions=%d\n",
		tok.ShortP99.Seconds()/results[same].ShortP99.Seconds(), same,
		tok.TokensPerSecond/results[best].TokensPerSecond, best, tok.Preemptions)
	return nil
}
