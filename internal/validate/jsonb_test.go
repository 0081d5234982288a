package validate_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dbtest"
	"github.com/llmq/llmq/internal/validate"
)

// jsonbSeeds are texts encoding/json accepts and jsonb may not, and their
// neighbours that jsonb does accept.
var jsonbSeeds = []string{
	`{"x":"\ud800"}`, `{"x":"\udc00"}`, `"\ud83d\ude00"`, `"\ud800x"`, `"\ud800\u0041"`, `{"\ud800":1}`,
	`"\u0000"`, `"\\u0000"`, `"\\\u0000"`, `"\\\\u0000"`,
	"\"\xff\"", "{\"a\":\"\xc3\x28\"}", `"é"`,
	`1e131071`, `1e131072`, `123e131070`, `12e131070`, `0.5e131072`, `0.5e131073`, `-1e200000`, `0e200000`,
	`1e-16383`, `1e-16384`, `0e-20000`, `1.5e-16382`, `1.5e-16383`, `0e1073741822`, `0e1073741823`, `1e2147483648`,
	`[0.` + strings.Repeat("0", 16382) + `1]`, `[0.` + strings.Repeat("0", 16383) + `1]`, `1.` + strings.Repeat("0", 16384),
	`{"a":[1,2,{"b":null}],"c":true}`, `-0`, `1E+5`,
}

// accepts reports whether PostgreSQL's jsonb input takes s, and fails the
// test on any error other than a refusal of the value.
func accepts(t testing.TB, pool *pgxpool.Pool, s string) bool {
	t.Helper()
	_, err := pool.Exec(context.Background(), "SELECT $1::text::jsonb", s)
	if err == nil {
		return true
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "%q", s)
	require.Contains(t, []string{"22P02", "22P05", "22003", "22021"}, pgErr.Code, "%q: %v", s, err)
	return false
}

// What validate.JSON accepts, jsonb stores: a value refused there would
// fail the statement and abort the caller's transaction. And for a valid
// JSON text, what jsonb stores, validate.JSON accepts.
func FuzzJSONAgreesWithJSONB(f *testing.F) {
	pool := dbtest.Pool(f, 2)
	for _, s := range jsonbSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		problem, _ := validate.JSON([]byte(s), len(s))
		if !utf8.ValidString(s) {
			// PostgreSQL refuses the parameter itself; the validator must too.
			require.NotEmpty(t, problem, "%q", s)
			return
		}
		stored := accepts(t, pool, s)
		if problem == "" {
			require.True(t, stored, "validate.JSON accepted %q, which jsonb refuses", s)
		} else if stored && problem != "is not valid JSON" {
			t.Fatalf("validate.JSON refused %q (%s), which jsonb stores", s, problem)
		}
	})
}

func TestJSONNamesWhatJSONBRefuses(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"x":"\ud800"}`:  "high surrogate",
		`"\udc00"`:        "low surrogate",
		`"\u0000"`:        `\u0000`,
		"\"\xff\"":        "UTF-8",
		`{"n":1e200000}`:  "numeric's range",
		`[1e-16384]`:      "numeric's range",
		`{"a":"\\u0000"}`: "",
		`"\ud83d\ude00"`:  "",
	} {
		problem, tooLarge := validate.JSON([]byte(in), 1<<20)
		require.False(t, tooLarge)
		if want == "" {
			require.Empty(t, problem, in)
		} else {
			require.Contains(t, problem, want, in)
		}
	}
}
