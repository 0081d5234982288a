package llmq_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// examplesInternal is the examples' own scaffolding (HTTP serving, SQL
// files, sample documents): a host copying an example copies it too, as
// its package docs say.
const examplesInternal = "github.com/llmq/llmq/examples/internal/"

// hostImportable reports whether a program outside this module could
// import path, so that an example importing it can be copied into a
// service: every package but llmq's internal ones, the examples' own
// scaffolding excepted.
func hostImportable(path string) bool {
	if strings.HasPrefix(path, examplesInternal) {
		return true
	}
	if !strings.HasPrefix(path, "github.com/llmq/llmq") {
		return true // the standard library and other modules
	}
	return !strings.Contains(path+"/", "/internal/")
}

func TestHostImportable(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]bool{
		"net/http":                                     true,
		"github.com/jackc/pgx/v5":                      true,
		"github.com/llmq/llmq/jobs":                    true,
		"github.com/llmq/llmq/provider/openai":         true,
		"github.com/llmq/llmq/examples/internal/serve": true,
		"github.com/llmq/llmq/internal/dbsql":          false,
		"github.com/llmq/llmq/internal":                false,
		"github.com/llmq/llmq/provider/internal/adapt": false,
	} {
		require.Equal(t, want, hostImportable(path), path)
	}
}

// Every example, its tests included, imports only what a host can import
// (the examples' own scaffolding under examples/internal, which is copied
// with them, aside): an example is a program to copy into a service.
func TestExamplesImportOnlyWhatAHostCan(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir("examples", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, spec := range f.Imports {
			imported, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			require.True(t, hostImportable(imported), "%s imports %s, which a host cannot import: copying the example would not build", path, imported)
		}
		checked++
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, checked)
}
