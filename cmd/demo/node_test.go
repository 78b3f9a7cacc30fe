package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/internal/nodeproc"
)

// TestNodeAddrNeedsTLS: a wildcard address is refused, and
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
	send(strings.Repeat(" ", 128<<10)) // twice the longest command line
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
	assert.Equal(t, nodeproc.Digest(nodeproc.Pattern(5, 1<<20)), r8.SHA256)
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
