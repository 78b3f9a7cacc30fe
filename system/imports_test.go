package system

import (
	"errors"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A user of the runtime imports package system (and package
// system/cluster for cluster mode, package system/cache for the loader
// cache, package cuda for device work of their own): every type, constant and error they meet is re-exported there.
// The runnable examples and the demo CLI are written as a user would, so
// they must not import the inner packages.
func TestUsersImportOnlySystem(t *testing.T) {
	inner := map[string]bool{
		"github.com/residency-go/residency/budget":             true,
		"github.com/residency-go/residency/actors":             true,
		"github.com/residency-go/residency/messages":           true,
		"github.com/residency-go/residency/messages/clusterpb": true,
	}
	var files []string
	for _, pattern := range []string{"example*_test.go", "cache/example*_test.go", "cluster/example*_test.go", "cluster/providers/example*_test.go", "../cmd/demo/*.go"} {
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

// goList runs the go command (go test puts it on PATH) in this package's
// folder and returns its output's lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is not on PATH")
	out, err := exec.Command(goBin, append([]string{"list"}, args...)...).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		require.NoError(t, err, "go list %v: %s", args, ee.Stderr)
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// Rooms by concern: a single-node program links no cluster transport.
// Package system depends on nothing of etcd, gRPC or echo; package
// system/cluster links gRPC (its transport) but no provider's client
// (the caller injects the provider); and system/cluster/providers is the
// only package of the module that imports etcd or echo itself.
func TestSystemLinksNoClusterTransport(t *testing.T) {
	heavy := map[string][]string{ // by package folder, relative to system/
		".":         {"go.etcd.io/", "google.golang.org/grpc", "github.com/labstack/echo"},
		"./cluster": {"go.etcd.io/", "github.com/labstack/echo"},
	}
	for pkg, refused := range heavy {
		deps := goList(t, "-deps", pkg)
		require.Greater(t, len(deps), 10, pkg)
		for _, d := range deps {
			for _, r := range refused {
				assert.False(t, strings.HasPrefix(d, r), "package %s depends on %s", filepath.Join("system", pkg), d)
			}
		}
	}
	const providers = "github.com/residency-go/residency/system/cluster/providers"
	lines := goList(t, "-f", "{{.ImportPath}} {{.Imports}} {{.TestImports}} {{.XTestImports}}", "../...")
	require.Greater(t, len(lines), 10)
	seen := false
	for _, l := range lines {
		pkg, imports, _ := strings.Cut(l, " ")
		direct := strings.Contains(imports, "go.etcd.io/") || strings.Contains(imports, "github.com/labstack/echo")
		if pkg == providers {
			seen = direct
			continue
		}
		assert.False(t, direct, "%s imports etcd or echo: only %s may", pkg, providers)
	}
	assert.True(t, seen, "%s no longer imports etcd and echo: update this test", providers)
}
