package llmqtype_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// goCmd runs the go command at the module's root and returns its output.
func goCmd(t *testing.T, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH to inspect the module with: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), path, args...)
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), stderr.String())
	return string(out)
}

// No public package's declarations (signatures, fields, type definitions)
// name a type of an internal package: go doc would hide its definition, and
// a host could not name it in its own code.
func TestNoInternalTypeInPublicAPI(t *testing.T) {
	t.Parallel()
	var public []string
	internalTypes := map[string]bool{} // "dbsql.DBTX"
	for line := range strings.Lines(goCmd(t, "list", "-f", "{{.ImportPath}} {{.Name}}", "./...")) {
		path, name, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch {
		case strings.Contains(path, "/internal/") || strings.HasSuffix(path, "/internal"):
			for decl := range strings.Lines(goCmd(t, "doc", "-short", "-all", path)) {
				if typ, ok := strings.CutPrefix(decl, "type "); ok {
					internalTypes[name+"."+strings.Fields(typ)[0]] = true
				}
			}
		case name != "main" && !strings.Contains(path, "/examples/"):
			public = append(public, path)
		}
	}
	require.NotEmpty(t, internalTypes)
	qualified := regexp.MustCompile(`\b[a-z][a-z0-9]*\.[A-Z]\w*`)
	for _, path := range public {
		sc := bufio.NewScanner(strings.NewReader(goCmd(t, "doc", "-all", path)))
		for sc.Scan() {
			line := sc.Text()
			// Doc text is indented by four spaces; field comments start with //.
			if strings.HasPrefix(line, "    ") || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			code, _, _ := strings.Cut(line, "//")
			for _, ref := range qualified.FindAllString(code, -1) {
				require.False(t, internalTypes[ref], "%s declares %q, a type of an internal package:\n%s", path, ref, line)
			}
		}
	}
}

// The examples are meant to be copied into a service, so they import no
// internal llmq package (their own scaffolding under examples/internal is
// theirs to import). Public llmq packages they import use internal ones, so
// this reads direct imports, not go list -deps.
func TestExamplesImportNoInternalPackage(t *testing.T) {
	t.Parallel()
	out := goCmd(t, "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}} {{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./examples/...")
	for line := range strings.Lines(out) {
		pkg, imports, _ := strings.Cut(line, ": ")
		for imp := range strings.FieldsSeq(imports) {
			require.False(t, strings.HasPrefix(imp, "github.com/llmq/llmq/internal/"), "%s imports %s", pkg, imp)
		}
	}
}
