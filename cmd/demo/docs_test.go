package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocsSetupAndCI: the README's opening says
// what `make test` installs besides Go modules, and why; the docs that
// show replay in CI use the built binary, whose exit status 2 or 130
// `go run` would turn into 1.
func TestDocsSetupAndCI(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	opening, _, _ := strings.Cut(string(readme), "\n## ")
	opening = strings.Join(strings.Fields(opening), " ")
	for _, want := range []string{"apt-get", "chromium", "etcd-server", "browser test", "tests/clusterproc", "CI=true"} {
		assert.True(t, strings.Contains(opening, want), "the README's opening does not say %q", want)
	}
	assert.False(t, strings.Contains(opening, "nothing else is installed"), "the README's opening says nothing else is installed")

	codeBlock := regexp.MustCompile("(?s)```sh\n(.*?)```")
	for _, path := range []string{"../../README.md", "../../docs/replay.md"} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range codeBlock.FindAllStringSubmatch(string(b), -1) {
			for _, line := range strings.Split(m[1], "\n") {
				assert.False(t, strings.HasPrefix(line, "go run ./cmd/demo replay"), "%s shows replay through go run: %s", path, line)
			}
		}
		text := strings.Join(strings.Fields(string(b)), " ")
		assert.True(t, strings.Contains(text, "go build -o bin/demo ./cmd/demo"), "%s does not show the built binary", path)
		assert.True(t, strings.Contains(text, "reports any non-zero exit status"), "%s does not say why", path)
	}
}
