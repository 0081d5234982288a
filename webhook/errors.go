package webhook

import (
	"errors"
)

// ErrInvalidConfig is matched by every *llmqtype.ValidationError about a
// configuration a constructor refused.
var ErrInvalidConfig = errors.New("webhook: invalid config")
