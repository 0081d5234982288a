package admission

import (
	"fmt"
	"math"

	"github.com/llmq/llmq/internal/validate"
)

// Pool is the limits of one provider pool. Limits are data: SetPool
// changes them at run time for every process at once (Postgres) or for
// this process (Local).
type Pool struct {
	// Name identifies the pool. Required.
	Name string `json:"name"`
	// RPM is the provider's requests-per-minute limit. Required.
	RPM int `json:"rpm"`
	// TPM is the provider's tokens-per-minute limit. Required.
	TPM int64 `json:"tpm"`
	// MaxInFlight bounds concurrent calls across every holder. Required.
	MaxInFlight int `json:"max_in_flight"`
	// MaxInFlightTokens bounds the tokens reserved by the calls in flight
	// (each Request.Tokens: its prompt plus its max output), all holders
	// together: the KV-cache budget of a local inference server, whose
	// capacity is the contexts it holds at once, not their number. A
	// request reserves its tokens against it with its slot and gives them
	// back when it is released, whatever the provider reported; a request
	// larger than it is never admissible. 0 means no such limit.
	MaxInFlightTokens int64 `json:"max_in_flight_tokens,omitempty"`
	// RequestBurst is the request bucket's size: the most requests granted
	// at once after a quiet spell. Default RPM/60 (one second's worth), at
	// least 1. Any window of w seconds admits at most RPM/60·w +
	// RequestBurst requests.
	RequestBurst int `json:"request_burst"`
	// TokenBurst is the token bucket's size, and so the largest request the
	// pool can ever admit. Default TPM/10 (six seconds' worth): large
	// enough for one big prompt, small enough not to swamp the provider's
	// own per-second enforcement.
	TokenBurst int64 `json:"token_burst"`
	// ChargeReserved is for providers that count a request's max_tokens
	// rather than the tokens it used: an answered call refunds nothing.
	ChargeReserved bool `json:"charge_reserved"`
	// RefundUncertain refunds the tokens of a call that was sent but not
	// answered (timeout, 5xx, 429), for providers known not to count them.
	// Default false: such calls keep their whole reservation.
	RefundUncertain bool `json:"refund_uncertain"`
	// InputPrice and OutputPrice are the provider's prices in micro-units
	// of a currency per million tokens (2_500_000 for $2.50), for the cost
	// column of the usage ledger. Zero records no cost.
	InputPrice  int64 `json:"input_price"`
	OutputPrice int64 `json:"output_price"`
	// BatchInputPrice and BatchOutputPrice are the prices of requests
	// served through the provider's batch API (package providerbatch), in
	// the same unit. Zero means half of InputPrice and OutputPrice: the
	// batch discount OpenAI and Anthropic both give.
	BatchInputPrice  int64 `json:"batch_input_price"`
	BatchOutputPrice int64 `json:"batch_output_price"`
}

// withDefaults validates p and fills in the bursts.
func (p Pool) withDefaults() (Pool, error) {
	fail := func(field, problem string) (Pool, error) { return p, invalid(field, problem) }
	if prob := validate.Text(p.Name, true, MaxPoolLen); prob != "" {
		return fail("Name", prob)
	}
	switch {
	case p.RPM <= 0 || p.RPM > math.MaxInt32:
		return fail("RPM", fmt.Sprintf("is %d; must be 1 to %d", p.RPM, math.MaxInt32))
	case p.TPM <= 0:
		return fail("TPM", fmt.Sprintf("is %d; must be positive", p.TPM))
	case p.MaxInFlight <= 0 || p.MaxInFlight > math.MaxInt32:
		return fail("MaxInFlight", fmt.Sprintf("is %d; must be 1 to %d", p.MaxInFlight, math.MaxInt32))
	case p.RequestBurst < 0 || p.RequestBurst > math.MaxInt32:
		return fail("RequestBurst", fmt.Sprintf("is %d; use 0 for the default or 1 to %d", p.RequestBurst, math.MaxInt32))
	case p.InputPrice < 0 || p.OutputPrice < 0:
		return fail("InputPrice/OutputPrice", "must not be negative")
	case p.BatchInputPrice < 0 || p.BatchOutputPrice < 0:
		return fail("BatchInputPrice/BatchOutputPrice", "must not be negative")
	case p.TokenBurst < 0:
		return fail("TokenBurst", fmt.Sprintf("is %d; use 0 for the default or a positive number", p.TokenBurst))
	case p.MaxInFlightTokens < 0:
		return fail("MaxInFlightTokens", fmt.Sprintf("is %d; use 0 for no limit or a positive number", p.MaxInFlightTokens))
	}
	if p.RequestBurst == 0 {
		p.RequestBurst = max(1, p.RPM/60)
	}
	if p.TokenBurst == 0 {
		p.TokenBurst = max(1, p.TPM/10)
	}
	return p, nil
}
