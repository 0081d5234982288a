package validate

import "unicode/utf8"

// PostgreSQL's numeric, which jsonb stores every number as, holds at most
// 131,072 digits before the decimal point and 16,383 after, and refuses
// an exponent beyond ±(2^31-1)/2 whatever the digits (numeric.c).
const (
	numericMaxIntDigits  = 131072
	numericMaxScale      = 16383
	numericMaxExponentAt = 1<<30 - 1
)

// jsonbProblem returns what PostgreSQL's jsonb input refuses in b, a valid
// JSON text, or "": invalid UTF-8, the escape \u0000, a UTF-16 surrogate
// escape without its pair, and numbers beyond numeric's range.
// encoding/json accepts all of these, and a statement given one fails,
// which aborts the caller's transaction; so they are refused here, as bad
// input, before anything is written.
func jsonbProblem(b []byte) string {
	if !utf8.Valid(b) {
		return "is not valid UTF-8"
	}
	for i := 0; i < len(b); {
		c := b[i]
		var problem string
		switch {
		case c == '"':
			i, problem = scanJSONString(b, i+1)
		case c == '-' || '0' <= c && c <= '9':
			i, problem = scanJSONNumber(b, i)
		default:
			i++
		}
		if problem != "" {
			return problem
		}
	}
	return ""
}

// scanJSONString checks the string whose contents start at b[i] and
// returns the index after its closing quote.
func scanJSONString(b []byte, i int) (int, string) {
	for i < len(b) {
		switch b[i] {
		case '"':
			return i + 1, ""
		case '\\':
			if b[i+1] != 'u' {
				i += 2
				continue
			}
			r := hex4(b[i+2 : i+6])
			i += 6
			switch {
			case r == 0:
				return i, `contains \u0000, which PostgreSQL jsonb cannot store`
			case 0xDC00 <= r && r <= 0xDFFF:
				return i, "contains a UTF-16 low surrogate escape without its high surrogate, which PostgreSQL jsonb refuses"
			case 0xD800 <= r && r <= 0xDBFF:
				if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
					return i, "contains a UTF-16 high surrogate escape without its low surrogate, which PostgreSQL jsonb refuses"
				}
				if low := hex4(b[i+2 : i+6]); low < 0xDC00 || low > 0xDFFF {
					return i, "contains a UTF-16 high surrogate escape without its low surrogate, which PostgreSQL jsonb refuses"
				}
				i += 6
			}
		default:
			i++
		}
	}
	return i, ""
}

// hex4 reads four hexadecimal digits, which a valid JSON text has after \u.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// scanJSONNumber checks the number starting at b[i] against numeric's
// range and returns the index after it.
func scanJSONNumber(b []byte, i int) (int, string) {
	digits := func() (start, end int) {
		start = i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return start, i
	}
	if b[i] == '-' {
		i++
	}
	intStart, intEnd := digits()
	fracStart, fracEnd := i, i
	if i < len(b) && b[i] == '.' {
		i++
		fracStart, fracEnd = digits()
	}
	var exp int64
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		negative := false
		if b[i] == '+' || b[i] == '-' {
			negative = b[i] == '-'
			i++
		}
		start, end := digits()
		for _, c := range b[start:end] {
			// Saturate: anything this large is refused below.
			exp = min(exp*10+int64(c-'0'), 1<<40)
		}
		if negative {
			exp = -exp
		}
	}
	const outOfRange = "has a number outside PostgreSQL numeric's range (131,072 digits before the decimal point, 16,383 after)"
	if exp >= numericMaxExponentAt || exp <= -numericMaxExponentAt {
		return i, outOfRange
	}
	if int64(fracEnd-fracStart)-exp > numericMaxScale {
		return i, outOfRange
	}
	// The digits before the decimal point of the value: counted from its
	// most significant digit, none for zero.
	for k := intStart; k < intEnd; k++ {
		if b[k] != '0' {
			if int64(intEnd-k)+exp > numericMaxIntDigits {
				return i, outOfRange
			}
			return i, ""
		}
	}
	for k := fracStart; k < fracEnd; k++ {
		if b[k] != '0' {
			if exp-int64(k-fracStart) > numericMaxIntDigits {
				return i, outOfRange
			}
			return i, ""
		}
	}
	return i, ""
}
