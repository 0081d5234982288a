package rabbitmq

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// Every type amqp091 reads from the wire has its documented text.
func TestFieldText(t *testing.T) {
	t.Parallel()
	stamp := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("CET", 3600))
	for _, tc := range []struct {
		name string
		in   any
		want string
	}{
		{"void", nil, ""},
		{"bool", true, "true"},
		{"false", false, "false"},
		{"int8", int8(-7), "-7"},
		{"uint8", uint8(200), "200"},
		{"int16", int16(-30000), "-30000"},
		{"uint16", uint16(60000), "60000"},
		{"int32", int32(-2000000000), "-2000000000"},
		{"uint32", uint32(4000000000), "4000000000"},
		{"int64", int64(math.MinInt64), "-9223372036854775808"},
		{"float32", float32(0.1), "0.1"},
		{"float64", 2.5e-300, "2.5e-300"},
		{"NaN", math.NaN(), "NaN"},
		{"infinity", math.Inf(-1), "-Inf"},
		{"string", "eu-west", "eu-west"},
		{"string as received", "a\x00\xff", "a\x00\xff"},
		{"bytes", []byte("raw"), "raw"},
		{"bytes as received", []byte{0xc3, 0x28}, "\xc3\x28"},
		{"timestamp in UTC", stamp, "2026-03-04T04:06:07Z"},
		{"decimal", amqp.Decimal{Scale: 2, Value: 12345}, "123.45"},
		{"decimal below one", amqp.Decimal{Scale: 3, Value: -5}, "-0.005"},
		{"decimal without scale", amqp.Decimal{Value: 42}, "42"},
		{"decimal zero", amqp.Decimal{Scale: 2}, "0.00"},
		{"table", amqp.Table{"region": "eu", "n": int32(7)}, `{"n":7,"region":"eu"}`},
		{"empty table", amqp.Table{}, `{}`},
		{"array", []any{int8(1), "two", nil, true}, `[1,"two",null,true]`},
		{"nested", amqp.Table{
			"at":    stamp,
			"price": amqp.Decimal{Scale: 2, Value: -199},
			"bytes": []byte("text"),
			"bin":   []byte{0xff, 0x00},
			"list":  []any{amqp.Table{"f": float32(1.5)}, []any{}},
			"nan":   math.NaN(),
			"inf":   float32(math.Inf(1)),
			"esc":   "q\"\\\n\t\x01<>&",
			"\xff":  "key not UTF-8",
		}, `{"at":"2026-03-04T04:06:07Z","bin":"/wA=","bytes":"text","esc":"q\"\\\n\t\u0001<>&","inf":"+Inf","list":[{"f":1.5},[]],"nan":"NaN","price":-1.99,"/w==":"key not UTF-8"}`},
		{"x-death", []any{amqp.Table{"count": int64(1), "reason": "rejected", "time": time.Unix(0, 0)}},
			`[{"count":1,"reason":"rejected","time":"1970-01-01T00:00:00Z"}]`},
		{"not an AMQP type", struct{}{}, "unsupported AMQP field type struct {}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := fieldText(tc.in)
			require.Equal(t, tc.want, got)
			if _, ok := tc.in.(amqp.Table); ok {
				require.True(t, json.Valid([]byte(got)))
			}
		})
	}
}

// A void llmq-key is Key "", as a null Kafka key is; void headers are "".
// Tables reach Message.Key and Headers as JSON.
func TestToMessageFieldTypes(t *testing.T) {
	t.Parallel()
	m := toMessage(amqp.Delivery{MessageId: "ev-1", Headers: amqp.Table{HeaderKey: nil, "tenant": nil, "ctx": amqp.Table{"n": int16(7)}}})
	require.Empty(t, m.Key)
	require.Equal(t, map[string]string{"tenant": "", "ctx": `{"n":7}`}, m.Headers)
	m = toMessage(amqp.Delivery{Headers: amqp.Table{HeaderKey: amqp.Table{"order": int64(7)}}})
	require.JSONEq(t, `{"order":7}`, m.Key)
}

// fieldGen builds an AMQP field value from fuzz input, one type byte and
// then that type's value, tables and arrays nesting at most maxDepth deep.
type fieldGen struct{ in []byte }

const maxDepth = 6

func (g *fieldGen) take(n int) []byte {
	out := make([]byte, n)
	k := copy(out, g.in)
	g.in = g.in[k:]
	return out
}

func (g *fieldGen) value(depth int) any {
	kinds := 16
	if depth >= maxDepth {
		kinds = 14 // no more tables and arrays
	}
	kind := int(g.take(1)[0]) % kinds
	raw := g.take(8)
	u := binary.BigEndian.Uint64(raw)
	switch kind {
	case 0:
		return nil
	case 1:
		return raw[0]&1 == 1
	case 2:
		return int8(raw[0])
	case 3:
		return raw[0]
	case 4:
		return int16(u)
	case 5:
		return uint16(u)
	case 6:
		return int32(u)
	case 7:
		return uint32(u)
	case 8:
		return int64(u)
	case 9:
		return math.Float32frombits(uint32(u))
	case 10:
		return math.Float64frombits(u)
	case 11:
		return amqp.Decimal{Scale: raw[0], Value: int32(u)}
	case 12:
		return time.Unix(int64(u%(400*365*86400)), 0) // amqp091 reads seconds; keep four-digit years
	case 13:
		text := g.take(int(raw[0]) % 12)
		if raw[1]&1 == 1 {
			return text
		}
		return string(text)
	case 14:
		t := amqp.Table{}
		for range int(raw[0]) % 5 {
			t[string(g.take(int(raw[1])%4))] = g.value(depth + 1)
		}
		return t
	}
	a := []any{}
	for range int(raw[0]) % 5 {
		a = append(a, g.value(depth+1))
	}
	return a
}

// Whatever field values a publisher sends, tables and arrays render as
// valid JSON that decodes to the same values under the documented rules,
// and other values as their documented text; nothing panics.
func FuzzFieldText(f *testing.F) {
	f.Add([]byte{14, 3, 2})
	f.Add([]byte{15, 4, 0, 0, 0, 0, 0, 0, 0, 11, 2, 0, 0, 0, 0, 0, 0, 0x30, 0x39})
	f.Add([]byte{13, 5, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 0, 0x22, 0x5c})
	f.Add([]byte{10, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		v := (&fieldGen{in: in}).value(0)
		got := fieldText(v)
		switch v := v.(type) {
		case amqp.Table, []any:
			require.True(t, json.Valid([]byte(got)), "not JSON: %s", got)
			dec := json.NewDecoder(bytes.NewReader([]byte(got)))
			dec.UseNumber()
			var decoded any
			require.NoError(t, dec.Decode(&decoded))
			requireSameField(t, v, decoded)
		case nil:
			require.Empty(t, got)
		case string:
			require.Equal(t, v, got)
		case []byte:
			require.Equal(t, string(v), got)
		default:
			// Scalars read as their JSON rendering does, quotes aside.
			var decoded any
			dec := json.NewDecoder(bytes.NewReader(appendFieldJSON(nil, v)))
			dec.UseNumber()
			require.NoError(t, dec.Decode(&decoded))
			requireSameField(t, v, decoded)
			if s, ok := decoded.(string); ok {
				require.Equal(t, s, got)
			} else {
				require.Equal(t, fmt.Sprint(decoded), got)
			}
		}
	})
}

// requireSameField checks that decoded, read from the JSON rendering of
// want, holds want's value by the documented rules.
func requireSameField(t *testing.T, want, decoded any) {
	t.Helper()
	switch w := want.(type) {
	case nil:
		require.Nil(t, decoded)
	case bool:
		require.Equal(t, w, decoded)
	case string:
		requireSameText(t, []byte(w), decoded)
	case []byte:
		requireSameText(t, w, decoded)
	case float32:
		requireSameFloat(t, float64(w), 32, decoded)
	case float64:
		requireSameFloat(t, w, 64, decoded)
	case time.Time:
		s, ok := decoded.(string)
		require.True(t, ok)
		parsed, err := time.Parse(time.RFC3339, s)
		require.NoError(t, err)
		require.Equal(t, w.Unix(), parsed.Unix())
		require.Equal(t, time.UTC, parsed.Location())
	case amqp.Decimal:
		n, ok := decoded.(json.Number)
		require.True(t, ok, "a decimal is a JSON number")
		got, ok := new(big.Rat).SetString(string(n))
		require.True(t, ok)
		exact := new(big.Rat).SetFrac(big.NewInt(int64(w.Value)), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(w.Scale)), nil))
		require.Zero(t, exact.Cmp(got), "%s is %v", n, exact)
	case amqp.Table:
		obj, ok := decoded.(map[string]any)
		require.True(t, ok)
		require.Len(t, obj, len(w), "distinct keys stay distinct: %v", w)
		for k, v := range w {
			if !utf8.ValidString(k) {
				k = base64.StdEncoding.EncodeToString([]byte(k))
			}
			requireSameField(t, v, obj[k])
		}
	case []any:
		arr, ok := decoded.([]any)
		require.True(t, ok)
		require.Len(t, arr, len(w))
		for i := range w {
			requireSameField(t, w[i], arr[i])
		}
	default:
		n, ok := decoded.(json.Number)
		require.True(t, ok, "an integer is a JSON number")
		s, ok := integerText(w)
		require.True(t, ok, "%T", w)
		want, _ := new(big.Int).SetString(s, 10)
		got, ok := new(big.Int).SetString(string(n), 10)
		require.True(t, ok, "an integer in decimal: %s", n)
		require.Zero(t, want.Cmp(got))
	}
}

func requireSameText(t *testing.T, want []byte, decoded any) {
	t.Helper()
	s, ok := decoded.(string)
	require.True(t, ok)
	if utf8.Valid(want) {
		require.Equal(t, string(want), s)
		return
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	require.Equal(t, want, raw)
}

func requireSameFloat(t *testing.T, want float64, bits int, decoded any) {
	t.Helper()
	switch {
	case math.IsNaN(want):
		require.Equal(t, "NaN", decoded)
	case math.IsInf(want, 1):
		require.Equal(t, "+Inf", decoded)
	case math.IsInf(want, -1):
		require.Equal(t, "-Inf", decoded)
	default:
		n, ok := decoded.(json.Number)
		require.True(t, ok)
		got, err := strconv.ParseFloat(string(n), bits)
		require.NoError(t, err)
		require.Equal(t, math.Float64bits(want), math.Float64bits(got), "%s reads back exactly", n)
	}
}
