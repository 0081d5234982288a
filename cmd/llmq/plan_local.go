package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// contextShare is one kind of document of a local plan: its prompt in
// tokens and its share of the backlog.
type contextShare struct {
	Tokens   float64 `json:"tokens"`
	Fraction float64 `json:"fraction"`
}

// maxContextShares bounds -contexts.
const maxContextShares = 100

// parseContexts reads -contexts: "tokens:fraction,..." (2500:0.8,60000:0.2),
// fractions summing to 1 within a thousandth.
func parseContexts(s string) ([]contextShare, error) {
	var out []contextShare
	sum := 0.0
	for part := range strings.SplitSeq(s, ",") {
		tok, frac, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("%q is not tokens:fraction", part)
		}
		t, err := strconv.ParseFloat(tok, 64)
		if err != nil || !(t >= 1) || math.IsInf(t, 0) {
			return nil, fmt.Errorf("%q: the tokens are not a number of at least 1", part)
		}
		f, err := strconv.ParseFloat(frac, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return nil, fmt.Errorf("%q: the fraction is not in (0, 1]", part)
		}
		if len(out) == maxContextShares {
			return nil, fmt.Errorf("more than %d kinds of documents", maxContextShares)
		}
		out = append(out, contextShare{Tokens: t, Fraction: f})
		sum += f
	}
	if math.Abs(sum-1) > 0.001 {
		return nil, fmt.Errorf("the fractions add up to %g, not 1", sum)
	}
	return out, nil
}

// localPlanInput is what a local pool's plan computes from.
type localPlanInput struct {
	KVTokens        float64        `json:"kv_tokens"`
	Contexts        []contextShare `json:"contexts"`
	MaxTokens       float64        `json:"max_tokens"`    // reserved per call beside the prompt
	OutputTokens    float64        `json:"output_tokens"` // generated per call
	PrefillPerToken time.Duration  `json:"-"`
	DecodeStep      time.Duration  `json:"-"`
	Backlog         float64        `json:"backlog"`
}

// localPlanResult is the arithmetic of a local pool.
type localPlanResult struct {
	Input                  localPlanInput `json:"input"`
	MeanReservation        float64        `json:"mean_reservation_tokens"`
	Concurrency            float64        `json:"admissible_concurrency"`
	LargestFits            bool           `json:"largest_fits"`
	PrefillSecondsPerCall  float64        `json:"prefill_seconds_per_call"`
	DecodeSecondsPerCall   float64        `json:"decode_seconds_per_call"`
	CallsPerSecond         float64        `json:"calls_per_s"`
	TokensPerSecond        float64        `json:"tokens_per_s"`
	MeanLatencySeconds     float64        `json:"mean_latency_seconds"`
	Binding                string         `json:"binding"`
	DrainSeconds           float64        `json:"drain_seconds"`
	PrefillPerTokenSeconds float64        `json:"prefill_per_token_seconds"`
	DecodeStepSeconds      float64        `json:"decode_step_seconds"`
}

// computeLocalPlan models a server that batches continuously, the model of
// examples/localserver: each call reserves its prompt plus max_tokens
// against the KV budget, so about KVTokens / mean reservation calls run at
// once; the engine prefills every prompt once (prefill is serial: it
// lengthens the step every running call waits for) and generates one
// token per running call per decode step. A backlog of B calls therefore
// takes B × (mean prompt × prefill per token + output × decode step /
// concurrency), and each call, by Little's law, concurrency / calls per
// second.
func computeLocalPlan(in localPlanInput) localPlanResult {
	r := localPlanResult{Input: in, PrefillPerTokenSeconds: in.PrefillPerToken.Seconds(), DecodeStepSeconds: in.DecodeStep.Seconds()}
	meanPrompt, largest := 0.0, 0.0
	for _, c := range in.Contexts {
		meanPrompt += c.Tokens * c.Fraction
		largest = max(largest, c.Tokens)
	}
	r.MeanReservation = meanPrompt + in.MaxTokens
	r.LargestFits = largest+in.MaxTokens <= in.KVTokens
	r.Concurrency = max(1, math.Floor(in.KVTokens/r.MeanReservation))
	r.PrefillSecondsPerCall = meanPrompt * r.PrefillPerTokenSeconds
	r.DecodeSecondsPerCall = in.OutputTokens * r.DecodeStepSeconds / r.Concurrency
	perCall := r.PrefillSecondsPerCall + r.DecodeSecondsPerCall
	r.CallsPerSecond = 1 / perCall
	r.TokensPerSecond = r.CallsPerSecond * (meanPrompt + in.OutputTokens)
	r.MeanLatencySeconds = r.Concurrency / r.CallsPerSecond
	r.Binding = "decode (the KV budget bounds the batch)"
	if r.PrefillSecondsPerCall > r.DecodeSecondsPerCall {
		r.Binding = "prefill (the engine's prompt rate)"
	}
	r.DrainSeconds = in.Backlog * perCall
	return r
}

var errLocalPlan = errors.New("bad local plan input")

func checkLocalPlan(in localPlanInput) error {
	switch {
	case !(in.KVTokens >= 1) || math.IsInf(in.KVTokens, 0):
		return fmt.Errorf("%w: -kv-tokens must be at least 1", errLocalPlan)
	case !(in.MaxTokens >= 0) || !(in.OutputTokens >= 1) || in.OutputTokens > in.MaxTokens:
		return fmt.Errorf("%w: -output-tokens must be at least 1 and at most -max-tokens", errLocalPlan)
	case in.PrefillPerToken <= 0 || in.DecodeStep <= 0:
		return fmt.Errorf("%w: -prefill-per-token and -decode-step must be positive", errLocalPlan)
	case !(in.Backlog >= 0) || math.IsInf(in.Backlog, 0):
		return fmt.Errorf("%w: -backlog must be finite and not negative", errLocalPlan)
	}
	return nil
}

func printLocalPlan(w io.Writer, r localPlanResult) error {
	in := r.Input
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "mean reservation\tmean prompt + %g max tokens\t= %.0f tokens\t\n", in.MaxTokens, r.MeanReservation)
	fmt.Fprintf(tw, "admissible concurrency\t%g KV tokens / mean reservation\t= %.0f calls in flight\t\n", in.KVTokens, r.Concurrency)
	if !r.LargestFits {
		fmt.Fprintf(tw, "largest document\tdoes not fit the budget with its max tokens\t= never admissible\t\n")
	}
	fmt.Fprintf(tw, "prefill per call\tmean prompt × %s\t= %.3fs\t\n", in.PrefillPerToken, r.PrefillSecondsPerCall)
	fmt.Fprintf(tw, "decode per call\t%g tokens × %s / %.0f in flight\t= %.3fs\t\n", in.OutputTokens, in.DecodeStep, r.Concurrency, r.DecodeSecondsPerCall)
	fmt.Fprintf(tw, "capacity\t1 / (prefill + decode), bound by %s\t= %.3f calls/s, %.0f tokens/s\t\n", r.Binding, r.CallsPerSecond, r.TokensPerSecond)
	fmt.Fprintf(tw, "mean latency\tconcurrency / capacity\t= %.2fs\t\n", r.MeanLatencySeconds)
	fmt.Fprintf(tw, "drain %g calls\t\t= %s\t\n", in.Backlog, planDuration(r.DrainSeconds))
	return tw.Flush()
}
