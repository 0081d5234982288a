package invoice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmq/llmq/jobs"
)

// Request limits of the API.
const (
	maxCreateBody = 16 << 10 // bytes of a POST /extraction-jobs body
	// maxVersion is the largest document version: versions are a Postgres
	// integer column.
	maxVersion = math.MaxInt32
)

// refusal is a request the API refuses: the status (4xx), a code, the
// field at fault (a JSON path, a header or "body") and what was wrong.
type refusal struct {
	status  int
	code    string
	field   string
	message string
}

func invalid(field, message string) *refusal {
	return &refusal{status: http.StatusUnprocessableEntity, code: "invalid", field: field, message: message}
}

var (
	nameRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)
	hexRe  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// checkName refuses a document name the API does not store: 1 to 200
// letters, digits, '.', '_' or '-' (so no NUL, no control character and
// nothing that is not UTF-8 reaches a query).
func checkName(field, name string) *refusal {
	if !nameRe.MatchString(name) {
		return invalid(field, "1 to 200 letters, digits, '.', '_' or '-'")
	}
	return nil
}

// checkDocumentText refuses OCR text that a Postgres text column cannot hold:
// invalid UTF-8 or a NUL byte.
func checkDocumentText(text []byte) *refusal {
	if !utf8.Valid(text) {
		return invalid("body", "the document is not valid UTF-8 text")
	}
	if i := bytes.IndexByte(text, 0); i >= 0 {
		return invalid("body", fmt.Sprintf("the document holds a NUL byte at offset %d", i))
	}
	return nil
}

// checkIdempotencyKey refuses a missing key (400: the header is required)
// and one the job store would refuse (422): longer than
// jobs.MaxIdempotencyKeyLen bytes, not UTF-8, or with a control character.
func checkIdempotencyKey(key string) *refusal {
	const field = "Idempotency-Key"
	if key == "" {
		return &refusal{status: http.StatusBadRequest, code: "invalid", field: field, message: "required"}
	}
	if problem := textProblem(key, jobs.MaxIdempotencyKeyLen); problem != "" {
		return invalid(field, problem)
	}
	return nil
}

// textProblem says what the job store would refuse in an identifier such
// as an idempotency key, or "" when it would take it: more than maxLen
// bytes, invalid UTF-8, or a control character.
func textProblem(s string, maxLen int) string {
	switch {
	case len(s) > maxLen:
		return fmt.Sprintf("is %d bytes, more than the limit of %d", len(s), maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "contains a control character"
	}
	return ""
}

// decodeCreateRequest reads the body of POST /extraction-jobs: exactly one
// JSON object of known fields, whose values the database can hold. body
// should be bounded (http.MaxBytesReader); a body over the bound is 413.
func decodeCreateRequest(body io.Reader) (CreateRequest, *refusal) {
	var req CreateRequest
	if cerr := decodeOne(body, &req, maxCreateBody); cerr != nil {
		return req, cerr
	}
	if cerr := checkDocument("document", req.Document); cerr != nil {
		return req, cerr
	}
	if req.Schema != SchemaV1 {
		return req, invalid("schema", "must be "+strconv.Quote(SchemaV1))
	}
	return req, nil
}

// decodeBatchRequest reads the body of POST /extraction-batches: exactly
// one JSON object of known fields holding 1 to MaxUploadDocuments
// documents, each as decodeCreateRequest checks one, no document named
// twice (it would be extracted, and paid for, twice).
func decodeBatchRequest(body io.Reader) (BatchRequest, *refusal) {
	var req BatchRequest
	if cerr := decodeOne(body, &req, maxUploadBody); cerr != nil {
		return req, cerr
	}
	if len(req.Documents) == 0 || len(req.Documents) > MaxUploadDocuments {
		return req, invalid("documents", fmt.Sprintf("1 to %d documents", MaxUploadDocuments))
	}
	type version struct {
		name    string
		version int
	}
	seen := make(map[version]int, len(req.Documents))
	for i, d := range req.Documents {
		field := fmt.Sprintf("documents[%d]", i)
		if cerr := checkDocument(field, d); cerr != nil {
			return req, cerr
		}
		if j, dup := seen[version{d.Name, d.Version}]; dup {
			return req, invalid(field, fmt.Sprintf("repeats documents[%d]", j))
		}
		seen[version{d.Name, d.Version}] = i
	}
	if req.Schema != SchemaV1 {
		return req, invalid("schema", "must be "+strconv.Quote(SchemaV1))
	}
	return req, nil
}

// decodeOne decodes exactly one JSON object of known fields into v from a
// body bounded to limit bytes (http.MaxBytesReader): 413 over the bound,
// 400 for anything that is not one such object.
func decodeOne(body io.Reader, v any, limit int) *refusal {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Exactly one value: anything after it but white space (a second
		// object, a stray brace) makes the body ambiguous.
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("the body holds more than one JSON value")
			if tooLarge(terr) {
				err = terr
			}
		}
	}
	if err != nil {
		if tooLarge(err) {
			return &refusal{status: http.StatusRequestEntityTooLarge, code: "too_large", field: "body", message: fmt.Sprintf("at most %d bytes", limit)}
		}
		return &refusal{status: http.StatusBadRequest, code: "invalid_json", field: jsonField(err), message: err.Error()}
	}
	return nil
}

// checkDocument refuses a document reference the database cannot hold;
// field names it in the body ("document", "documents[3]").
func checkDocument(field string, d Document) *refusal {
	if d.Name == "" {
		return invalid(field+".name", "required")
	}
	if cerr := checkName(field+".name", d.Name); cerr != nil {
		return cerr
	}
	switch {
	case d.Version < 1 || d.Version > maxVersion:
		return invalid(field+".version", fmt.Sprintf("an object version, 1 to %d", maxVersion))
	case !hexRe.MatchString(d.SHA256):
		return invalid(field+".sha256", "the hex SHA-256 of the document's content")
	}
	return nil
}

func tooLarge(err error) bool {
	_, ok := errors.AsType[*http.MaxBytesError](err)
	return ok
}

// jsonField names the JSON field a decoding error is about: the path of a
// value of the wrong type (document.version), a time that does not parse
// (needed_by, the requests' only time; encoding/json does not say where
// a value's own UnmarshalJSON failed), an unknown field, else the body.
func jsonField(err error) string {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
		return te.Field
	}
	if _, ok := errors.AsType[*time.ParseError](err); ok {
		return "needed_by"
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if name, err := strconv.Unquote(f); err == nil && name != "" {
			return name
		}
	}
	return "body"
}
