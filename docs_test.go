package llmq_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// The README's getting-started program is examples/typed/main.go, byte for
// byte, so the program a reader copies is the one its test runs.
func TestReadmeShowsTheTypedExampleVerbatim(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	program, err := os.ReadFile(filepath.Join("examples", "typed", "main.go"))
	require.NoError(t, err)
	const begin = "<!-- begin examples/typed/main.go -->\n```go\n"
	const end = "```\n<!-- end examples/typed/main.go -->"
	start := bytes.Index(readme, []byte(begin))
	require.GreaterOrEqual(t, start, 0, "README.md has no %q marker", strings.TrimSpace(begin))
	block := readme[start+len(begin):]
	stop := bytes.Index(block, []byte(end))
	require.GreaterOrEqual(t, stop, 0, "README.md has no %q marker", end)
	require.Equal(t, string(program), string(block[:stop]),
		"README.md's getting-started block differs from examples/typed/main.go: copy the file into the block")
}

// The README stays a guide: at most 350 lines, the rest in docs/.
func TestReadmeIsShort(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.LessOrEqual(t, bytes.Count(readme, []byte("\n")), 350)
}

// Every relative link of the README, the changelog and docs/ points to a
// file or directory of the repository, and every #anchor to a heading of
// the Markdown file it names.
func TestDocumentationLinksResolve(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	pages = append(pages, "README.md", "CHANGELOG.md")
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		text, err := os.ReadFile(page)
		require.NoError(t, err)
		anchors[page] = headingAnchors(string(text))
		return anchors[page]
	}
	for _, page := range pages {
		text, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, link := range markdownLinks(string(text)) {
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(link, "#")
			target := page
			if path != "" {
				target = filepath.Join(filepath.Dir(page), path)
				_, err := os.Stat(target)
				require.NoError(t, err, "%s links to %q, which does not exist", page, link)
			}
			if anchor == "" {
				continue
			}
			require.True(t, strings.HasSuffix(target, ".md"), "%s links to an anchor of %q, not a Markdown file", page, link)
			require.True(t, anchorsOf(target)[anchor], "%s links to %q: %s has no heading with that anchor", page, link, target)
		}
	}
}

var (
	linkPattern   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingPrefix = regexp.MustCompile(`^#{1,6} `)
)

// markdownLinks returns the targets of the inline links outside fenced code
// blocks and code spans.
func markdownLinks(text string) []string {
	var links []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkPattern.FindAllStringSubmatch(withoutCodeSpans(line), -1) {
			links = append(links, m[1])
		}
	}
	return links
}

// withoutCodeSpans blanks the text of a line's `code` spans, so that a
// span never reads as a link, while a link whose text is a code span
// ([`jobs`](jobs)) still does.
func withoutCodeSpans(line string) string {
	var b strings.Builder
	inSpan := false
	for _, r := range line {
		switch {
		case r == '`':
			inSpan = !inSpan
		case inSpan:
			b.WriteRune('x')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// headingAnchors returns the anchors a Markdown renderer gives the headings
// of text, as GitHub makes them: lower case, punctuation dropped, spaces as
// hyphens, and -1, -2 appended to repeats.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !headingPrefix.MatchString(line) {
			continue
		}
		slug := slugify(headingPrefix.ReplaceAllString(line, ""))
		if n := seen[slug]; n > 0 {
			anchors[slug+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

func slugify(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
