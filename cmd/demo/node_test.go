package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/nodeproc"
	"github.com/residency-go/residency/system"
)

// TestParseNodeCommand: a node reads its commands as strictly as the
// replay reads its ops (issue 18, item 20): duplicate keys, unknown or
// mistyped fields and bad values are refused with a message naming them,
// and the reply keeps the line's id whenever one can be read.
func TestParseNodeCommand(t *testing.T) {
	ok := []struct {
		line string
		want nodeproc.Command
	}{
		{`{"id":1,"op":"register","name":"w","bytes":16,"at":"cuda:0","seed":7}`, nodeproc.Command{ID: 1, Op: "register", Name: "w", Bytes: 16, At: "cuda:0", Seed: 7}},
		{`{"id":2,"op":"register","name":"w","bytes":"16MiB","source":"pageable-host"}`, nodeproc.Command{ID: 2, Op: "register", Name: "w", Bytes: 16 << 20, Source: "pageable-host"}},
		{`{"id":3,"op":"copy","name":"w","bytes":4,"from":"a","at":"cuda:0","remote":"v","source":"pinned-host","location":"cuda:1","timeout_ms":5000}`,
			nodeproc.Command{ID: 3, Op: "copy", Name: "w", Bytes: 4, From: "a", At: "cuda:0", Remote: "v", Source: "pinned-host", Location: "cuda:1", TimeoutMS: 5000}},
		{`{"op":"members"}`, nodeproc.Command{Op: "members"}},
		{`{"id":-4,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"],"pinned-host"],"hold":true,"max_attempts":2}`,
			nodeproc.Command{ID: -4, Op: "place", Name: "r", Value: "w", Tiers: [][]string{{"cuda:0@*"}, {"pinned-host"}}, Hold: true, MaxAttempts: 2}},
		{` {"id":5,"op":"inspect","name":"w"} `, nodeproc.Command{ID: 5, Op: "inspect", Name: "w"}},
	}
	for _, c := range ok {
		got, err := parseNodeCommand([]byte(c.line))
		require.NoError(t, err, c.line)
		assert.Equal(t, c.want, got, c.line)
	}

	bad := []struct {
		line   string
		id     int64
		op     string
		reason string
	}{
		{`{"id":1,"op":"register","name":"a","name":"b","bytes":5,"at":"cuda:0"}`, 1, "register", `duplicate key "name"`},
		{`{"id":2,"op":"register","name":"a","bytes":5,"at":"cuda:0","color":"red"}`, 2, "register", `unknown field "color"`},
		{`{"id":3,"op":"register","name":"a","bytes":-5,"at":"cuda:0"}`, 3, "register", `field "bytes": must be > 0, got -5`},
		{`{"id":4,"op":"register","name":"a","bytes":0,"at":"cuda:0"}`, 4, "register", `must be > 0`},
		{`{"id":5,"op":"register","name":"a","bytes":1e30,"at":"cuda:0"}`, 5, "register", `too large`},
		{`{"id":6,"op":"register","name":"a","bytes":5}`, 6, "register", `exactly one of "at"`},
		{`{"id":7,"op":"register","name":"a","bytes":5,"at":"cuda:0","source":"pageable-host"}`, 7, "register", `exactly one of "at"`},
		{`{"id":8,"op":"register","bytes":5,"at":"cuda:0"}`, 8, "register", `needs field "name"`},
		{`{"id":9,"op":"members","timeout_ms":-1}`, 9, "members", `"timeout_ms": -1 is outside`},
		{`{"id":10,"op":"members","timeout_ms":9223372036854775807}`, 10, "members", `"timeout_ms"`},
		{`{"id":11,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"]],"hold":1}`, 11, "place", `field "hold": want true or false, got a number`},
		{`{"id":12,"op":"place","name":"r","value":"w","tiers":[["cuda:0@*"]],"max_attempts":-1}`, 12, "place", `"max_attempts": -1 is outside`},
		{`{"id":13,"op":"place","name":"r","value":"w","tiers":[[1]]}`, 13, "place", `want a location (a string), got a number`},
		{`{"id":14,"op":"explode"}`, 14, "?", `unknown op "explode"`},
		{`{"id":15,"op":"read","name":7,"at":"cuda:0"}`, 15, "read", `field "name": want a string, got a number`},
		{`{"id":"x","op":"members"}`, 0, "?", `field "id": want an integer, got a string`},
		{`{"id":1.5,"op":"members"}`, 0, "?", `not a whole number`},
		{`{"op":5}`, 0, "?", `field "op": want a string`},
		{`not json`, 0, "?", `malformed command: column 1`},
		{`[1,2]`, 0, "?", `not a JSON object`},
		{`{"id":16,"op":"members"} {"id":17}`, 0, "?", `after the end of the JSON value`},
		{strings.Repeat("[", 100), 0, "?", `nested more than`},
	}
	for _, c := range bad {
		_, err := parseNodeCommand([]byte(c.line))
		var ce *nodeCommandError
		require.ErrorAs(t, err, &ce, c.line)
		assert.Contains(t, ce.msg, c.reason, c.line)
		assert.True(t, strings.HasPrefix(ce.msg, "malformed command: "), ce.msg)
		r := ce.reply()
		assert.Equal(t, c.id, r.ID, c.line)
		assert.Equal(t, c.op, r.Op, c.line)
		assert.False(t, r.OK)
		assert.Equal(t, "InvalidInputError", r.ErrorType)
	}
}

// TestNodeCommandsOfTheDrivers: every command internal/nodeproc sends (as
// the multi-process tests and cluster-demo build them) reads back as sent.
func TestNodeCommandsOfTheDrivers(t *testing.T) {
	for _, c := range []nodeproc.Command{
		{ID: 1, Op: "register", Name: "w", Bytes: 16 << 20, At: "cuda:0", Seed: 42},
		{ID: 2, Op: "register", Name: "wp", Bytes: 1 << 20, Source: "pageable-host", Seed: 4},
		{ID: 3, Op: "copy", Name: "w", From: "node-a", Bytes: 16 << 20, At: "cuda:0"},
		{ID: 4, Op: "copy", Name: "w-a", Remote: "w", From: "node-a", Bytes: 16 << 20, At: "cuda:0", TimeoutMS: 5000},
		{ID: 5, Op: "read", Name: "w", At: "cuda:0"},
		{ID: 6, Op: "discard", Name: "w"},
		{ID: 7, Op: "whereis", Name: "w"},
		{ID: 8, Op: "members"},
		{ID: 9, Op: "summaries"},
		{ID: 10, Op: "refresh"},
		{ID: 11, Op: "place", Name: "serve-w", Value: "w", Tiers: [][]string{{"cuda:0@*"}}, Hold: true, TimeoutMS: 10000},
		{ID: 12, Op: "release", Name: "serve-w"},
		{ID: 13, Op: "inspect", Name: "w"},
	} {
		b, err := json.Marshal(c)
		require.NoError(t, err)
		got, err := parseNodeCommand(b)
		require.NoError(t, err, "%s", b)
		assert.Equal(t, c, got, "%s", b)
	}
}

// TestReadCommandLine: a line longer than the bound is skipped whole (its
// bytes never held), and the next line is read as usual.
func TestReadCommandLine(t *testing.T) {
	long := strings.Repeat("x", 3*maxCommandLine)
	br := bufio.NewReaderSize(strings.NewReader(`{"op":"members"}`+"\r\n"+long+"\n"+"last"), 64<<10)
	line, tooLong, err := readCommandLine(br, nil, maxCommandLine)
	require.NoError(t, err)
	assert.False(t, tooLong)
	assert.Equal(t, `{"op":"members"}`, string(line))
	line, tooLong, err = readCommandLine(br, nil, maxCommandLine)
	require.NoError(t, err)
	assert.True(t, tooLong)
	assert.Nil(t, line)
	line, tooLong, err = readCommandLine(br, nil, maxCommandLine)
	require.NoError(t, err)
	assert.False(t, tooLong)
	assert.Equal(t, "last", string(line))
	_, _, err = readCommandLine(br, nil, maxCommandLine)
	assert.ErrorIs(t, err, io.EOF)
}

// TestRegisterPatternAdmitsFirst (defect 13): register never panics on its
// size, and makes no byte of a value its location's budget refuses: the
// runtime's refusal comes first. bytes -5 and 2^63−1 used to panic
// (makeslice) and take the node down; 256 MiB at an 8 MiB cuda:0
// allocated the 256 MiB before the budget refused them.
func TestRegisterPatternAdmitsFirst(t *testing.T) {
	ctx := context.Background()
	sys, err := startSoft(t, ctx, system.Options{ManagerID: "node-test", Locations: []system.LocationConfig{
		system.NoLimit("pageable-host"), system.Limit("cuda:0", 8<<20)}})
	require.NoError(t, err)
	defer func() { require.NoError(t, sys.Close(ctx)) }()

	var inv *system.InvalidInputError
	var be *system.BudgetError
	_, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "neg", Bytes: -5, At: "cuda:0"})
	require.ErrorAs(t, err, &inv)
	_, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "max", Bytes: math.MaxInt64, At: "cuda:0"})
	require.ErrorAs(t, err, &be)
	_, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "max", Bytes: math.MaxInt64, Source: "cuda:0"})
	require.ErrorAs(t, err, &inv, "never fits the budget of its source")
	_, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "max", Bytes: math.MaxInt64, At: "pageable-host"})
	require.ErrorAs(t, err, &inv, "a location without a budget takes at most maxUnbudgetedPattern")
	assert.Contains(t, err.Error(), "has no budget")
	_, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "max", Bytes: maxUnbudgetedPattern + 1, Source: "pageable-host"})
	require.ErrorAs(t, err, &inv)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "big", Bytes: 256 << 20, At: "cuda:0"})
	runtime.ReadMemStats(&after)
	require.ErrorAs(t, err, &be)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(32<<20), "bytes allocated before the budget refused 256 MiB")

	sum, err := registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "w", Bytes: 1 << 20, At: "cuda:0", Seed: 3})
	require.NoError(t, err)
	assert.Equal(t, digestOf(nodeproc.Pattern(3, 1<<20)), sum)
	h, err := sys.Lookup(ctx, "w")
	require.NoError(t, err)
	b, err := sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	assert.Equal(t, sum, digestOf(b))

	sum, err = registerPattern(ctx, sys, nodeproc.Command{Op: "register", Name: "l", Bytes: 3<<20 + 5, Source: "pageable-host", Seed: 9})
	require.NoError(t, err)
	assert.Equal(t, digestOf(nodeproc.Pattern(9, 3<<20+5)), sum, "the digest computed piece by piece")
	h, err = sys.Lookup(ctx, "l")
	require.NoError(t, err)
	require.NoError(t, sys.Place(ctx, h, "cuda:0"))
	b, err = sys.Read(ctx, h, "cuda:0")
	require.NoError(t, err)
	assert.Equal(t, sum, digestOf(b), "the loader makes the same bytes")

	snap, err := sys.Snapshot(ctx)
	require.NoError(t, err)
	for _, l := range snap.Locations {
		assert.Zero(t, l.ReservedBytes, "%s: register's reservation is gone", l.Location)
	}
}

// TestNodeAddrNeedsTLS (defect 14): a wildcard address is refused, and
// an address other than loopback needs TLS; bad TLS flags exit 2.
func TestNodeAddrNeedsTLS(t *testing.T) {
	for _, c := range []struct {
		addr string
		tls  bool
		want string // "" accepted
	}{
		{"127.0.0.1:0", false, ""},
		{"[::1]:7000", false, ""},
		{"localhost:0", false, ""},
		{"0.0.0.0:0", false, "wildcard"},
		{"0.0.0.0:0", true, "wildcard"},
		{"[::]:0", true, "wildcard"},
		{":7000", true, "wildcard"},
		{"10.1.2.3:0", false, "not a loopback address"},
		{"node-a.example:7000", false, "not a loopback address"},
		{"10.1.2.3:0", true, ""},
		{"nonsense", false, "want host:port"},
	} {
		err := checkNodeAddr(c.addr, c.tls)
		if c.want == "" {
			assert.NoError(t, err, c.addr)
		} else if assert.Error(t, err, c.addr) {
			assert.Contains(t, err.Error(), c.want, c.addr)
		}
	}

	dir := t.TempDir()
	cert, key, ca := writeTestCerts(t, dir)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--addr", "0.0.0.0:0"}, "wildcard"},
		{[]string{"--addr", "10.1.2.3:0"}, "give --tls-cert, --tls-key and --tls-ca"},
		{[]string{"--tls-cert", cert}, "needs all of --tls-cert, --tls-key and --tls-ca"},
		{[]string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", filepath.Join(dir, "missing.pem")}, "--tls-ca"},
		{[]string{"--tls-cert", cert, "--tls-key", cert, "--tls-ca", ca}, "--tls-cert"},
		{[]string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", key}, "no PEM certificate"},
	} {
		args := append([]string{"node", "--name", "n", "--provider", "automanaged"}, c.args...)
		code, out, errs := runDemo(t, args...)
		assert.Equal(t, 2, code, "%v", args)
		assert.Empty(t, out)
		assert.Contains(t, errs, c.want, "%v", args)
	}
}

// TestNodeProcessHostileInput (defects 13, 14, 20) runs a node process
// with mutual TLS and feeds it hostile commands: each gets an error reply
// with its id, the node keeps serving (a later register and read agree
// on the digest), and SIGINT stops it with status 0 and no error logged
// (protoactor's health server stopping is not one).
func TestNodeProcessHostileInput(t *testing.T) {
	exe := demoBinary(t)
	dir := t.TempDir()
	cert, key, ca := writeTestCerts(t, dir)
	port, err := nodeproc.FreePort()
	require.NoError(t, err)
	cmd := exec.Command(exe, "node", "--name", "n1", "--provider", "automanaged", "--automanaged-addr", fmt.Sprintf("127.0.0.1:%d", port),
		"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--location", "cuda:0=8MiB", "--location", "pageable-host=unlimited")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range lines {
		}
	})
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the node exited; its log:\n%s", stderr.String())
			return l
		case <-time.After(2 * time.Minute):
			t.Fatalf("no line from the node; its log:\n%s", stderr.String())
			return ""
		}
	}
	var ready nodeproc.Ready
	require.NoError(t, json.Unmarshal([]byte(next()), &ready))
	require.Equal(t, "ready", ready.Event)

	send := func(line string) {
		_, err := stdin.Write([]byte(line + "\n"))
		require.NoError(t, err)
	}
	send(`{"id":1,"op":"register","name":"a","bytes":-5,"at":"cuda:0"}`)
	send(`{"id":2,"op":"register","name":"a","bytes":9223372036854775807,"at":"cuda:0"}`)
	send(`{"id":3,"op":"register","name":"a","bytes":"64GiB","at":"cuda:0"}`)
	send(`{"id":4,"op":"register","name":"a","bytes":"2GiB","at":"pageable-host"}`)
	send(`{"id":5,"op":"register","name":"a","name":"b","bytes":5,"at":"cuda:0"}`)
	send(`{"id":6,"op":"register","name":"a","bytes":5,"at":"cuda:0","color":"red"}`)
	send(`{"id":7,"op":"members","timeout_ms":99999999999999999}`)
	send(`not json`)
	send(strings.Repeat(" ", 2*maxCommandLine))
	want := map[int64]string{1: "InvalidInputError", 2: "BudgetError", 3: "BudgetError", 4: "InvalidInputError",
		5: "InvalidInputError", 6: "InvalidInputError", 7: "InvalidInputError"}
	got := map[int64]nodeproc.Reply{}
	zero := 0
	for len(got) < len(want) || zero < 2 {
		var r nodeproc.Reply
		require.NoError(t, json.Unmarshal([]byte(next()), &r))
		if r.ID == 0 {
			zero++
		} else {
			got[r.ID] = r
		}
		assert.False(t, r.OK, "%+v", r)
	}
	for id, typ := range want {
		assert.Equal(t, typ, got[id].ErrorType, "command %d: %s", id, got[id].Error)
	}
	// Still serving, and sane.
	send(`{"id":8,"op":"register","name":"w","bytes":"1MiB","at":"cuda:0","seed":5}`)
	r8 := nodeproc.Reply{}
	require.NoError(t, json.Unmarshal([]byte(next()), &r8))
	require.True(t, r8.OK, "%+v", r8)
	send(`{"id":9,"op":"read","name":"w","at":"cuda:0"}`)
	r9 := nodeproc.Reply{}
	require.NoError(t, json.Unmarshal([]byte(next()), &r9))
	require.True(t, r9.OK, "%+v", r9)
	assert.Equal(t, digestOf(nodeproc.Pattern(5, 1<<20)), r8.SHA256)
	assert.Equal(t, r8.SHA256, r9.SHA256)

	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for range lines {
	}
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status after SIGINT; log:\n%s", stderr.String())
	case <-time.After(time.Minute):
		t.Fatal("the node did not stop after SIGINT")
	}
	logs := stderr.String()
	assert.Contains(t, logs, `"message":"node stopped"`)
	assert.NotContains(t, logs, `"level":"error"`)
	assert.NotContains(t, logs, "panic")
	assert.NotContains(t, logs, "goroutine ")
}

// writeTestCerts writes a throwaway CA and a certificate it signed for
// 127.0.0.1 and localhost (PEM files), for a node's TLS flags.
func writeTestCerts(t *testing.T, dir string) (cert, key, ca string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	require.NoError(t, err)
	write := func(name, typ string, der []byte) string {
		var b bytes.Buffer
		require.NoError(t, pem.Encode(&b, &pem.Block{Type: typ, Bytes: der}))
		return writeFile(t, dir, name, b.String())
	}
	return write("node.pem", "CERTIFICATE", leafDER), write("node-key.pem", "EC PRIVATE KEY", keyDER), write("ca.pem", "CERTIFICATE", caDER)
}
