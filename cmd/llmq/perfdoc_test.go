package main

import (
	"context"
	"errors"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// benchCommandPattern finds a `llmq bench ...` command in a code span:
// `llmq bench ...` or `go run ./cmd/llmq bench ...`, capturing its
// arguments.
var benchCommandPattern = regexp.MustCompile("`(?:go run \\./cmd/llmq|llmq) bench((?: [^`]*)?)`")

// summaryTableRows returns the rows of the first Markdown table of text:
// the summary table of docs/performance.md.
func summaryTableRows(text string) []string {
	var rows []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "|") {
			rows = append(rows, line)
			continue
		}
		if len(rows) > 0 {
			break
		}
	}
	return rows
}

// checkBenchCommand parses args (a `llmq bench` command's arguments) with
// the bench's own flag set, connecting to nothing and running nothing. A
// soak (-mode soak) has a flag set of its own inside runBenchSoak: it runs
// with a context already cancelled, so it stops at its first connection,
// after its flags and their values were parsed and checked.
func checkBenchCommand(args []string) error {
	if isSoak(args) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := runBenchSoak(ctx, args, io.Discard, io.Discard)
		if errors.Is(err, errFlag) || errors.Is(err, errUsage) || errors.Is(err, errHelpUsage) {
			return err
		}
		return nil
	}
	_, _, _, err := parseBenchFlags(args, io.Discard)
	return err
}

// Every `llmq bench` command of the summary table in docs/performance.md
// names flags the bench has, with values they accept, so that a reader
// can run the command that measured each figure.
func TestPerformanceDocCommandsParse(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("../../docs/performance.md")
	require.NoError(t, err)
	rows := summaryTableRows(string(text))
	require.Greater(t, len(rows), 2, "docs/performance.md starts with no summary table")
	var commands []string
	for _, row := range rows {
		for _, m := range benchCommandPattern.FindAllStringSubmatch(row, -1) {
			commands = append(commands, m[1])
		}
	}
	require.NotEmpty(t, commands, "the summary table holds no `llmq bench` command")
	for _, command := range commands {
		require.NoError(t, checkBenchCommand(strings.Fields(command)), "docs/performance.md: `llmq bench%s`", command)
	}
}

// The check itself refuses what the bench would refuse.
func TestPerformanceDocCommandCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		row string
		ok  bool
	}{
		{"| drain | `llmq bench -mode drain -jobs 100000 -workers 2000 -wal-records=false -json` |", true},
		{"| relay | `go run ./cmd/llmq bench -mode relay -broker rabbitmq -jobs 20000 -workers 1` |", true},
		{"| soak | `llmq bench -mode soak -duration 30m -rate 500 -retention 5m` |", true},
		{"| made up | `llmq bench -mode drain -jobz 100000` |", false},                 // no such flag
		{"| made up | `llmq bench -mode drain -jobs many` |", false},                   // not a number
		{"| made up | `llmq bench -mode latency -rate 100/s` |", false},                // not a float
		{"| made up | `llmq bench -mode admission -hold 2 seconds` |", false},          // not a duration, and a stray argument
		{"| made up | `llmq bench -mode soak -duration 30m -retention soon` |", false}, // not a retention
		{"| made up | `llmq bench -mode soak -tenants 1000` |", false},                 // a drain flag, not a soak's
	} {
		m := benchCommandPattern.FindStringSubmatch(tc.row)
		require.NotNil(t, m, tc.row)
		err := checkBenchCommand(strings.Fields(m[1]))
		if tc.ok {
			require.NoError(t, err, tc.row)
		} else {
			require.Error(t, err, tc.row)
		}
	}
}
