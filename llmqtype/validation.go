package llmqtype

import "fmt"

// ValidationError says which input field was wrong and why. Every llmq
// package returns it for bad input, before anything is written.
//
// Kind is the sentinel of the package that refused the input (for example
// jobs.ErrInvalidParams or outbox.ErrInvalidEvent) and Cause an optional,
// more specific one (for example jobs.ErrPayloadTooLarge); errors.Is
// matches both.
//
//	var verr *llmqtype.ValidationError
//	if errors.As(err, &verr) {
//		http.Error(w, verr.Field+" "+verr.Problem, http.StatusBadRequest)
//	}
type ValidationError struct {
	Kind    error  // the refusing package's sentinel
	Field   string // the input field, as named in Go (e.g. "Payload", "Tenant")
	Problem string // what is wrong with it, e.g. "must not be empty"
	Cause   error  // a more specific sentinel, or nil
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("%v: %s: %s", e.Kind, e.Field, e.Problem)
}

// Unwrap exposes Kind and Cause to errors.Is and errors.As.
func (e *ValidationError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Cause}
}
