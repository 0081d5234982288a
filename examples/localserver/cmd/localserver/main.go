// Command localserver serves package localserver's simulated local
// inference server (an OpenAI-compatible chat completions endpoint over a
// KV cache of a fixed size, with vLLM's metrics at /metrics) until
// interrupted.
//
//	go run ./examples/localserver/cmd/localserver -addr 127.0.0.1:8091 -kv-tokens 200000 -scale 10
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/llmq/llmq/examples/internal/serve"
	"github.com/llmq/llmq/examples/localserver"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8091", "listen address")
	kv := flag.Int64("kv-tokens", 200_000, "the KV cache's capacity in tokens")
	running := flag.Int("max-running", 256, "requests run at once")
	step := flag.Duration("decode-step", 25*time.Millisecond, "one decode step, before scaling")
	prefill := flag.Duration("prefill-per-token", 50*time.Microsecond, "prefill time per prompt token, before scaling")
	out := flag.Int64("output-tokens", 200, "tokens each request generates (at most its max_tokens)")
	scale := flag.Float64("scale", 1, "divide every time by this")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	s := localserver.New(localserver.Config{
		KVTokens: *kv, MaxRunning: *running, DecodeStep: *step, PrefillPerToken: *prefill, OutputTokens: *out, Scale: *scale,
	})
	fmt.Println("localserver listening on", *addr)
	// An overcommitted server answers late: the write timeout must not cut
	// a long queue's answers short.
	err := serve.HTTP(ctx, serve.NewServer(*addr, s, serve.Limits{Write: 10 * time.Minute}), 5*time.Second)
	stop()
	s.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "localserver:", err)
		os.Exit(1)
	}
}
