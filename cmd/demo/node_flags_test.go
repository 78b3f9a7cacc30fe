package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNodeBadFlagsExit2: every bad flag of demo node is a usage error,
// exit status 2 with a message naming it, before anything starts: a
// port out of range, a zero or negative budget, a location given twice,
// a malformed location name, a negative duration.
func TestNodeBadFlagsExit2(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--addr", "127.0.0.1:99999"}, "the port must be a number 0 to 65535"},
		{[]string{"--addr", "127.0.0.1:-1"}, "the port must be a number 0 to 65535"},
		{[]string{"--addr", "127.0.0.1:http"}, "the port must be a number 0 to 65535"},
		{[]string{"--location", "cuda:0=0"}, `budget "0" of cuda:0: want a size > 0`},
		{[]string{"--location", "cuda:0=-1"}, "cuda:0=-1"},
		{[]string{"--location", "cuda:0=1GiB", "--location", "cuda:0=2GiB"}, "location cuda:0 is given twice"},
		{[]string{"--location", "cuda:x=1GiB"}, `malformed location "cuda:x"`},
		{[]string{"--location", "gpu=1GiB"}, `malformed location "gpu"`},
		{[]string{"--location", "cuda:0@other=1GiB"}, `--location: cuda:0@other is memory of node "other", not of this node ("n")`},
		{[]string{"--location", "cuda:0=1GiB", "--location", "cuda:0@n=1GiB"}, "--location: cuda:0 is given twice (as cuda:0 and as cuda:0@n)"},
		{[]string{"--request-timeout", "-1s"}, "--request-timeout -1s: want a duration > 0"},
		{[]string{"--request-timeout", "0s"}, "--request-timeout 0s: want a duration > 0"},
		{[]string{"--refresh", "-1s"}, "--refresh -1s: want a duration > 0"},
		{[]string{"--etcd-dial-timeout", "-5s"}, "--etcd-dial-timeout -5s: want a duration > 0"},
		{[]string{"--automanaged-refresh", "-1ms"}, "--automanaged-refresh -1ms: want a duration > 0"},
		{[]string{"--refresh", "9999999h"}, `invalid value "9999999h" for flag -refresh`},
	} {
		args := append([]string{"node", "--name", "n", "--provider", "automanaged"}, c.args...)
		code, out, errs := runDemo(t, args...)
		assert.Equal(t, 2, code, "%v: %s", args, errs)
		assert.Empty(t, out, "%v", args)
		assert.Contains(t, errs, c.want, "%v", args)
		assert.NotContains(t, errs, "no locations configured", "%v", args)
	}
}

// TestNodeTLSFilesAreBounded: --tls-cert, --tls-key and --tls-ca are read
// up to 1 MiB each; a larger file (or /dev/zero, which never ends) is
// refused with a message naming the flag and the bound, not read into
// memory without end.
func TestNodeTLSFilesAreBounded(t *testing.T) {
	dir := t.TempDir()
	cert, key, ca := writeTestCerts(t, dir)
	big := filepath.Join(dir, "big.pem")
	f, err := os.Create(big)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(maxPEMBytes+1)) // sparse: costs no disk
	require.NoError(t, f.Close())
	sources := []string{big}
	if _, err := os.Stat("/dev/zero"); err == nil {
		sources = append(sources, "/dev/zero")
	}
	for _, src := range sources {
		for i, flagName := range []string{"--tls-cert", "--tls-key", "--tls-ca"} {
			files := []string{cert, key, ca}
			files[i] = src
			args := []string{"node", "--name", "n", "--provider", "automanaged",
				"--tls-cert", files[0], "--tls-key", files[1], "--tls-ca", files[2]}
			code, out, errs := runDemo(t, args...)
			assert.Equal(t, 2, code, "%v: %s", args, errs)
			assert.Empty(t, out)
			assert.Contains(t, errs, flagName+" "+src+": larger than 1048576 bytes (1 MiB)", "%v", args)
		}
	}
}
