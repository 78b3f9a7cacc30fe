package system

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A user of the runtime imports package system alone (and package cuda
// for device work of their own): every type, constant and error they meet
// is re-exported here. The runnable examples and the demo CLI are written
// as a user would, so they must not import the inner packages.
func TestUsersImportOnlySystem(t *testing.T) {
	inner := map[string]bool{
		"github.com/residency-go/residency/budget":   true,
		"github.com/residency-go/residency/actors":   true,
		"github.com/residency-go/residency/messages": true,
	}
	var files []string
	for _, pattern := range []string{"example*_test.go", "../cmd/demo/*.go"} {
		m, err := filepath.Glob(pattern)
		require.NoError(t, err)
		files = append(files, m...)
	}
	require.NotEmpty(t, files)
	fset := token.NewFileSet()
	for _, f := range files {
		ast, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		require.NoError(t, err, f)
		for _, imp := range ast.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			assert.False(t, inner[path], "%s imports %s: re-export what it needs from package system", f, path)
		}
	}
}
