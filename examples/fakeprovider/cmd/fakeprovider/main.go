// Command fakeprovider serves the fake provider of package fakeprovider
// (OpenAI's chat completions and Anthropic's Messages API, and their batch
// APIs) until interrupted.
//
//	go run ./examples/fakeprovider/cmd/fakeprovider -addr 127.0.0.1:8090 -scale 100 -rpm 600
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/examples/internal/serve"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	mean := flag.Duration("mean-latency", 15*time.Second, "mean answer time before scaling")
	scale := flag.Float64("scale", 100, "divide the mean latency by this")
	rpm := flag.Int("rpm", 600, "requests per minute enforced")
	tpm := flag.Int("tpm", 1_000_000, "tokens per minute enforced")
	timeouts := flag.Float64("timeout-rate", 0, "probability of a call that hangs")
	malformed := flag.Float64("malformed-rate", 0, "probability of malformed JSON")
	wrong := flag.Float64("wrong-rate", 0, "probability of a plausible but wrong extraction")
	batchDelay := flag.Duration("batch-delay", 10*time.Minute, "how long a batch takes to complete, before scaling")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	fmt.Println("fakeprovider listening on", *addr)
	provider := fakeprovider.New(fakeprovider.Config{
		MeanLatency: *mean, Scale: *scale, RPM: *rpm, TPM: *tpm,
		TimeoutRate: *timeouts, MalformedRate: *malformed, WrongRate: *wrong,
		BatchDelay: *batchDelay,
	})
	// An answer takes up to about 20 times the scaled mean (the latency's
	// exponential tail); the write timeout must not cut it short. A call
	// that hangs on purpose hangs until its client gives up, whatever the
	// timeout.
	limits := serve.Limits{Write: max(serve.DefaultWrite, time.Duration(25*float64(*mean) / *scale))}
	err := serve.HTTP(ctx, serve.NewServer(*addr, provider, limits), 5*time.Second)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeprovider:", err)
		os.Exit(1)
	}
}
