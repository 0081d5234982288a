package validate

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestText(t *testing.T) {
	t.Parallel()
	require.Empty(t, Text("acme", true, 10))
	require.Empty(t, Text("", false, 10))
	require.Equal(t, "must not be empty", Text("", true, 10))
	require.Contains(t, Text("abcdefghijk", true, 10), "limit of 10")
	require.Equal(t, "is not valid UTF-8", Text("\xff", true, 10))
	require.Equal(t, "contains a control character", Text("a\tb", true, 10))
}

func TestStorable(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                 "",
		"plain é":          "plain é",
		"nul \x00 here":    "nul \uFFFD here",
		"bad \xff\xfe end": "bad \uFFFD end",
	} {
		require.Equal(t, want, MakeStorable(in), "%q", in)
		require.Equal(t, in == want, Storable(in), "%q", in)
		require.True(t, Storable(MakeStorable(in)), "%q", in)
	}
}

func FuzzMakeStorable(f *testing.F) {
	for _, s := range []string{"", "a", "\x00", "\xff", "é\x00\xc3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := MakeStorable(s)
		require.True(t, Storable(out), "%q became %q", s, out)
		if Storable(s) {
			require.Equal(t, s, out, "a storable text is kept as it is")
		}
	})
}

func TestJSON(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{`{}`, `[1,"a"]`, `"\\u0000 is only text here"`, `null`} {
		problem, _ := JSON([]byte(ok), 100)
		require.Empty(t, problem, ok)
	}
	problem, tooLarge := JSON([]byte(`{"a":1}`), 3)
	require.True(t, tooLarge)
	require.Contains(t, problem, "limit of 3")
	for _, bad := range []string{`{`, `{} {}`, ``, `{"a":"\u0000"}`, `["\u0000"]`, `{"\u0000":1}`} {
		problem, tooLarge := JSON([]byte(bad), 100)
		require.NotEmpty(t, problem, bad)
		require.False(t, tooLarge, bad)
	}
}

func TestError(t *testing.T) {
	t.Parallel()
	kind, cause := errors.New("invalid thing"), errors.New("too large")
	err := error(&Error{Kind: kind, Field: "Payload", Problem: "is big", Cause: cause})
	require.EqualError(t, err, "invalid thing: Payload: is big")
	require.ErrorIs(t, err, kind)
	require.ErrorIs(t, err, cause)
	require.True(t, Is(err, kind))
	require.False(t, Is(errors.New("other"), kind))
}
