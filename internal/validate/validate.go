// Package validate holds the field error that llmq's public packages return
// for bad input, and the checks they share.
package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/llmq/llmq/llmqtype"
)

// Error is llmqtype.ValidationError, the one field error every public
// package returns.
type Error = llmqtype.ValidationError

// Text checks a required or optional identifier-like string: at most maxLen
// bytes of valid UTF-8 without control characters. It returns the problem,
// or "" when s is acceptable.
func Text(s string, required bool, maxLen int) string {
	switch {
	case s == "" && required:
		return "must not be empty"
	case len(s) > maxLen:
		return fmt.Sprintf("is %d bytes, more than the limit of %d", len(s), maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "contains a control character"
	}
	return ""
}

// Storable reports whether a PostgreSQL text or jsonb value can hold s:
// valid UTF-8 without NUL.
func Storable(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// MakeStorable makes s storable as PostgreSQL text: invalid UTF-8 and NUL
// become U+FFFD. It is for texts that quote what llmq was given, such as
// error messages and quarantine reasons, which must be recorded rather
// than fail the statement.
func MakeStorable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// JSON checks that b is one JSON value of at most maxLen bytes that
// PostgreSQL's jsonb accepts. It returns the problem and, for an oversize
// value, tooLarge; "" when b is acceptable.
func JSON(b []byte, maxLen int) (problem string, tooLarge bool) {
	if len(b) > maxLen {
		return fmt.Sprintf("is %d bytes, more than the limit of %d", len(b), maxLen), true
	}
	if !json.Valid(b) {
		return "is not valid JSON", false
	}
	return jsonbProblem(b), false
}

// Is reports whether err is a field error of kind, for tests.
func Is(err, kind error) bool {
	var fe *Error
	return errors.As(err, &fe) && errors.Is(fe.Kind, kind)
}
