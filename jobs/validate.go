package jobs

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/llmqtype"
)

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func validName(s string, maxLen int) bool {
	return len(s) <= maxLen && namePattern.MatchString(s)
}

// kindProblem says what is wrong with a kind's name, or "".
func kindProblem(kind string) string {
	switch {
	case kind == "":
		return "must not be empty"
	case !validName(kind, MaxKindLen):
		return fmt.Sprintf("%q: use letters, digits, '.', '_' and '-', at most %d bytes", kind, MaxKindLen)
	}
	return ""
}

func checkText(s string, required bool, maxLen int) string {
	return validate.Text(s, required, maxLen)
}

// normalize validates p against the store's configuration and fills in the
// defaults, so that what is written is exactly what was checked.
func (s *PostgresStore) normalize(p EnqueueParams, now time.Time) (EnqueueParams, error) {
	fail := func(field, problem string, cause error) (EnqueueParams, error) {
		return p, &llmqtype.ValidationError{Kind: ErrInvalidParams, Field: field, Problem: problem, Cause: cause}
	}
	if problem := checkText(p.Tenant, true, MaxTenantLen); problem != "" {
		return fail("Tenant", problem, nil)
	}
	if problem := kindProblem(p.Kind); problem != "" {
		return fail("Kind", problem, nil)
	}
	if p.Queue == "" {
		p.Queue = DefaultQueue
	}
	if !s.queues[p.Queue] {
		return fail("Queue", fmt.Sprintf("%q is not one of the configured queues %q", p.Queue, s.cfg.Queues), ErrUnknownQueue)
	}
	if p.Priority < 0 || p.Priority > MaxPriority {
		return fail("Priority", fmt.Sprintf("is %d; use 0 (most urgent) to %d", p.Priority, MaxPriority), nil)
	}
	if len(p.Payload) == 0 {
		p.Payload = json.RawMessage(`{}`)
	}
	if problem, tooLarge := validate.JSON(p.Payload, s.cfg.MaxPayloadBytes); problem != "" {
		var cause error
		if tooLarge {
			cause = ErrPayloadTooLarge
		}
		return fail("Payload", problem, cause)
	}
	if problem := checkText(p.IdempotencyKey, false, MaxIdempotencyKeyLen); problem != "" {
		return fail("IdempotencyKey", problem, nil)
	}
	if problem := checkText(p.RequestHash, false, MaxRequestHashLen); problem != "" {
		return fail("RequestHash", problem, nil)
	}
	if p.IdempotencyKey != "" && p.RequestHash == "" {
		hash, err := RequestHash(struct {
			Kind    string          `json:"kind"`
			Payload json.RawMessage `json:"payload"`
		}{p.Kind, p.Payload})
		if err != nil {
			return fail("Payload", err.Error(), nil)
		}
		p.RequestHash = hash
	}
	if problem := checkText(p.GroupKey, false, MaxGroupKeyLen); problem != "" {
		return fail("GroupKey", problem, nil)
	}
	switch {
	case p.MaxAttempts == 0:
		p.MaxAttempts = s.cfg.DefaultMaxAttempts
	case p.MaxAttempts < 1 || p.MaxAttempts > MaxMaxAttempts:
		return fail("MaxAttempts", fmt.Sprintf("is %d; use 1 to %d, or 0 for the default of %d", p.MaxAttempts, MaxMaxAttempts, s.cfg.DefaultMaxAttempts), nil)
	}
	if !p.DeadlineAt.IsZero() {
		start := now
		if p.AvailableAt.After(now) {
			start = p.AvailableAt
		}
		if !p.DeadlineAt.After(start) {
			return fail("DeadlineAt", fmt.Sprintf("%s is not after the job's earliest start %s", p.DeadlineAt.Format(time.RFC3339Nano), start.Format(time.RFC3339Nano)), nil)
		}
	}
	if p.EstimatedTokens < 0 {
		return fail("EstimatedTokens", fmt.Sprintf("is %d; must not be negative", p.EstimatedTokens), nil)
	}
	reuse, field, problem := normalizeReuse(p.Reuse)
	if problem != "" {
		return fail(field, problem, nil)
	}
	p.Reuse = reuse
	return p, nil
}
