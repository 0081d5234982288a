package localserver

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/examples/fakeprovider"
)

// Document is one request of a backlog: a prompt of PromptTokens tokens.
type Document struct {
	PromptTokens int64
}

// MixedBacklog returns n documents, seeded: four in five short (1,000 to
// 4,000 tokens) and one in five long (40,000 to 80,000), shuffled.
func MixedBacklog(n int, seed uint64) []Document {
	r := rand.New(rand.NewPCG(seed, seed))
	docs := make([]Document, n)
	for i := range docs {
		if i%5 == 0 {
			docs[i].PromptTokens = 40_000 + r.Int64N(40_001)
		} else {
			docs[i].PromptTokens = 1_000 + r.Int64N(3_001)
		}
	}
	r.Shuffle(n, func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
	return docs
}

// BacklogOptions describe one run of a backlog through admission against
// a server.
type BacklogOptions struct {
	// URL is the server's base URL (…/v1 is appended).
	URL string
	// Limiter admits the calls; its Pool is the pool every call asks.
	Limiter admission.Limiter
	Pool    string
	// Workers call concurrently, as a runner's workers would. Default 64.
	Workers int
	// MaxTokens is each call's max_tokens, reserved with its prompt.
	// Default 200.
	MaxTokens int64
	// ShortTokens is the longest prompt counted as a short document in the
	// result. Default 10,000.
	ShortTokens int64
}

// BacklogResult is what a run measured.
type BacklogResult struct {
	Elapsed time.Duration
	// TokensPerSecond is the documents' prompt and output tokens over the
	// run's time: the useful work, recomputation not counted.
	TokensPerSecond float64
	// ShortP50 and ShortP99 are the completion times of the short
	// documents, from the start of the run (the whole backlog is there
	// at the start); LongP99 the long documents'.
	ShortP50, ShortP99, LongP99 time.Duration
	// MeanInFlight is the time-weighted mean of the calls in flight.
	MeanInFlight float64
	Preemptions  int64
}

// RunBacklog sends docs through opts.Limiter to the server, opts.Workers at
// a time, each worker acquiring a permit for its next document (prompt
// plus max_tokens), sleeping out denials, and releasing the permit with the
// usage the server reported. server, when set, is read for its preemptions.
func RunBacklog(ctx context.Context, server *Server, docs []Document, opts BacklogOptions) (BacklogResult, error) {
	opts.Workers = cmp.Or(opts.Workers, 64)
	opts.MaxTokens = cmp.Or(opts.MaxTokens, 200)
	opts.ShortTokens = cmp.Or(opts.ShortTokens, 10_000)
	var before Stats
	if server != nil {
		before = server.Stats()
	}
	next := make(chan Document, len(docs))
	for _, d := range docs {
		next <- d
	}
	close(next)
	var (
		mu          sync.Mutex
		short, long []time.Duration
		useful      int64
		inFlight    int
		area        float64 // calls in flight × seconds
		lastChange  time.Time
		firstErr    error
	)
	start := time.Now()
	lastChange = start
	track := func(delta int) {
		now := time.Now()
		area += float64(inFlight) * now.Sub(lastChange).Seconds()
		inFlight += delta
		lastChange = now
	}
	var wg sync.WaitGroup
	for range opts.Workers {
		wg.Go(func() {
			for d := range next {
				if err := runOne(ctx, d, opts, func(delta int) { mu.Lock(); track(delta); mu.Unlock() }); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				done := time.Since(start)
				mu.Lock()
				useful += d.PromptTokens + opts.MaxTokens
				if d.PromptTokens <= opts.ShortTokens {
					short = append(short, done)
				} else {
					long = append(long, done)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return BacklogResult{}, firstErr
	}
	elapsed := time.Since(start)
	res := BacklogResult{
		Elapsed: elapsed, TokensPerSecond: float64(useful) / elapsed.Seconds(),
		ShortP50: quantile(short, 0.5), ShortP99: quantile(short, 0.99), LongP99: quantile(long, 0.99),
		MeanInFlight: area / elapsed.Seconds(),
	}
	if server != nil {
		res.Preemptions = server.Stats().Preemptions - before.Preemptions
	}
	return res, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// runOne acquires a permit for d, calls the server and releases the
// permit with the reported usage; inFlight is told of the call's start and
// end.
func runOne(ctx context.Context, d Document, opts BacklogOptions, inFlight func(int)) error {
	req := admission.Request{Pool: opts.Pool, Tokens: d.PromptTokens + opts.MaxTokens}
	var p *admission.Permit
	for p == nil {
		var err error
		p, err = opts.Limiter.Acquire(ctx, req)
		if wait, ok := admission.WaitDuration(err); ok {
			t := time.NewTimer(min(wait, 5*time.Millisecond)) // the limiter's wait, polled finely
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("acquiring for a %d-token document: %w", d.PromptTokens, err)
		}
	}
	inFlight(1)
	usage, err := complete(ctx, opts.URL, d.PromptTokens, opts.MaxTokens)
	inFlight(-1)
	if err != nil {
		return errors.Join(err, p.Release(context.WithoutCancel(ctx), admission.CallOutcome{Result: admission.CallUncertain}))
	}
	return p.Release(ctx, admission.CallOutcome{Result: admission.CallAnswered, InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens})
}

// complete sends one chat completion of a prompt of promptTokens tokens.
func complete(ctx context.Context, url string, promptTokens, maxTokens int64) (fakeprovider.Usage, error) {
	out, status, err := Post(ctx, url, int(promptTokens), int(maxTokens))
	if err != nil {
		return fakeprovider.Usage{}, err
	}
	if status != http.StatusOK {
		return fakeprovider.Usage{}, fmt.Errorf("the server answered %d %s", status, http.StatusText(status))
	}
	return out.Usage, nil
}

// Post sends the server at url one chat completion of promptTokens
// (counted as the server counts them) and maxTokens, and returns its
// answer and status code; the answer is decoded only for a 200.
func Post(ctx context.Context, url string, promptTokens, maxTokens int) (fakeprovider.ChatResponse, int, error) {
	body, err := json.Marshal(fakeprovider.ChatRequest{Model: "local", MaxTokens: maxTokens,
		Messages: []fakeprovider.ChatMessage{{Role: "user", Content: strings.Repeat("abcd", max(0, promptTokens-1))}}})
	if err != nil {
		return fakeprovider.ChatResponse{}, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return fakeprovider.ChatResponse{}, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fakeprovider.ChatResponse{}, 0, err
	}
	defer resp.Body.Close()
	var out fakeprovider.ChatResponse
	if resp.StatusCode == http.StatusOK {
		err = json.NewDecoder(resp.Body).Decode(&out)
	}
	return out, resp.StatusCode, err
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
