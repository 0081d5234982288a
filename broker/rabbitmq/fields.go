package rabbitmq

import (
	"encoding/base64"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fieldText renders a received AMQP field value as the text of a
// broker.Message header (see the package documentation, "Header values"):
// void is "", strings and byte arrays are their bytes, booleans and
// numbers are what Go's strconv writes, timestamps RFC 3339 in UTC,
// decimals exact decimal text, and tables and arrays JSON (fieldJSON).
// Every reader of another language can parse these; fmt.Sprint's Go
// notation (map[n:7], {2 12345}) nobody can.
func fieldText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	case bool:
		return strconv.FormatBool(v)
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case time.Time:
		return timestampText(v)
	case amqp.Decimal:
		return decimalText(v)
	case amqp.Table, []any:
		return string(appendFieldJSON(nil, v))
	}
	if s, ok := integerText(v); ok {
		return s
	}
	return unsupportedText(v)
}

// unsupportedText names a value of a type that is no AMQP field type.
// amqp091's reader never returns one; only a Table built by hand can hold
// it.
func unsupportedText(v any) string { return fmt.Sprintf("unsupported AMQP field type %T", v) }

// integerText renders AMQP's integer types (and Go's int and uint, which
// amqp091 writes but never reads) in decimal.
func integerText(v any) (string, bool) {
	switch v := v.(type) {
	case int8:
		return strconv.FormatInt(int64(v), 10), true
	case int16:
		return strconv.FormatInt(int64(v), 10), true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case int:
		return strconv.FormatInt(int64(v), 10), true
	case uint8:
		return strconv.FormatUint(uint64(v), 10), true
	case uint16:
		return strconv.FormatUint(uint64(v), 10), true
	case uint32:
		return strconv.FormatUint(uint64(v), 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case uint:
		return strconv.FormatUint(uint64(v), 10), true
	}
	return "", false
}

// timestampText renders an AMQP timestamp (whole seconds since the epoch)
// in RFC 3339, in UTC: amqp091 reads it in the process's local zone, which
// would make the text depend on where the receiver runs.
func timestampText(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// decimalText renders an AMQP decimal, Value·10^-Scale, exactly: 12345
// with scale 2 is "123.45", -5 with scale 3 "-0.005". It is a valid JSON
// number too.
func decimalText(d amqp.Decimal) string {
	digits := strconv.FormatInt(int64(d.Value), 10)
	sign := ""
	if d.Value < 0 {
		sign, digits = "-", digits[1:]
	}
	scale := int(d.Scale)
	if scale == 0 {
		return sign + digits
	}
	if len(digits) <= scale {
		digits = strings.Repeat("0", scale-len(digits)+1) + digits
	}
	point := len(digits) - scale
	return sign + digits[:point] + "." + digits[point:]
}

// appendFieldJSON appends v as JSON: void as null, booleans as such,
// integers, finite floats and decimals as numbers, NaN and the infinities
// as the strings "NaN", "+Inf" and "-Inf" (JSON has no such numbers),
// timestamps as RFC 3339 strings, strings and byte arrays as JSON strings
// when they are valid UTF-8 and otherwise as strings of their base64
// (standard, padded), tables as objects with their keys in byte order
// (keys follow the strings' rule), arrays as arrays.
func appendFieldJSON(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case string:
		return appendTextJSON(b, v)
	case []byte:
		return appendTextJSON(b, string(v))
	case bool:
		return strconv.AppendBool(b, v)
	case float32:
		return appendFloatJSON(b, float64(v), 32)
	case float64:
		return appendFloatJSON(b, v, 64)
	case time.Time:
		return appendTextJSON(b, timestampText(v))
	case amqp.Decimal:
		return append(b, decimalText(v)...)
	case amqp.Table:
		return appendTableJSON(b, v)
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendFieldJSON(b, e)
		}
		return append(b, ']')
	}
	if s, ok := integerText(v); ok {
		return append(b, s...)
	}
	return appendTextJSON(b, unsupportedText(v))
}

func appendTableJSON(b []byte, t amqp.Table) []byte {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendTextJSON(b, k)
		b = append(b, ':')
		b = appendFieldJSON(b, t[k])
	}
	return append(b, '}')
}

func appendFloatJSON(b []byte, f float64, bits int) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"+Inf"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Inf"`...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits)
}

// appendTextJSON appends s as a JSON string if it is valid UTF-8, and its
// bytes' base64 as one otherwise: a JSON string holds only Unicode text,
// and encoding/json would replace the invalid bytes, losing them.
func appendTextJSON(b []byte, s string) []byte {
	if !utf8.ValidString(s) {
		s = base64.StdEncoding.EncodeToString([]byte(s))
	}
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
