package webhook

import (
	"errors"

	"github.com/llmq/llmq/internal/validate"
)

// ValidationError names the field that was wrong and why. Its Kind is one of
// this package's sentinels (ErrInvalidConfig, ErrInvalidKey,
// ErrInvalidEndpoint, ErrInvalidEvent).
type ValidationError = validate.Error

// ErrInvalidConfig is matched by every *ValidationError about a
// configuration a constructor refused.
var ErrInvalidConfig = errors.New("webhook: invalid config")
