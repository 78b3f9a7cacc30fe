package liveview_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

type waiterJSON struct {
	Name        string   `json:"name"`
	Class       int      `json:"class"`
	Locations   []string `json:"locations"`
	AllowBypass bool     `json:"allow_bypass"`
	Since       *string  `json:"since"`
	Tries       int      `json:"tries"`
	Eligible    bool     `json:"eligible"`
}

// TestWaiters: /waiters lists System.Waiters in queue order, every field
// equal to it; looking changes nothing; {"waiters": []} when nobody
// waits, and after Close.
func TestWaiters(t *testing.T) {
	f := newFixture(t)
	srv := mount(t, f.sys)
	before := f.sys.Waiters()
	resp, body := do(t, http.MethodGet, srv.URL+prefix+"/waiters")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	require.Equal(t, before, f.sys.Waiters(), "the queue did not change around the request")

	var got struct {
		Waiters []waiterJSON `json:"waiters"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Len(t, got.Waiters, len(before))
	for i, w := range before {
		g := got.Waiters[i]
		since := w.Since.UTC().Format(time.RFC3339Nano)
		assert.Equal(t, waiterJSON{Name: w.Name, Class: w.Class, Locations: w.Locations, AllowBypass: w.AllowBypass,
			Since: &since, Tries: w.Tries, Eligible: w.Eligible}, g)
		assert.True(t, w.Since.Equal(parseTime(t, g.Since)))
	}
	// The fixture's waiter, so the comparison above compared something.
	require.Len(t, got.Waiters, 1)
	assert.Equal(t, "batch-7", got.Waiters[0].Name)
	assert.Equal(t, 2, got.Waiters[0].Class)
	assert.Equal(t, []string{"cuda:0"}, got.Waiters[0].Locations)
	assert.True(t, got.Waiters[0].Eligible)
	assert.Positive(t, got.Waiters[0].Tries)
	assert.Regexp(t, `^\{"waiters":\[\{"name":"batch-7","class":2,"locations":\["cuda:0"\],"allow_bypass":false,"since":"[^"]+","tries":\d+,"eligible":true\}\]\}$`, body)

	sys := startSoft(t)
	bare := mount(t, sys)
	_, body = do(t, http.MethodGet, bare.URL+prefix+"/waiters")
	assert.JSONEq(t, `{"waiters":[]}`, body)
	require.NoError(t, sys.Close(context.Background()))
	resp, body = do(t, http.MethodGet, bare.URL+prefix+"/waiters")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.JSONEq(t, `{"waiters":[]}`, body)
}

// TestWaitersInQueueOrder: several waiters are listed in the queue's
// order (higher classes first), a held-up one marked not eligible.
func TestWaitersInQueueOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sys := startSoft(t)
	holder, _, err := sys.Admit(ctx, system.Request{Name: "holder", Reservations: []system.ReservationSpec{{Name: "holder", Location: "cuda:0", Bytes: 1 << 20}}})
	require.NoError(t, err)
	done := make(chan error, 3)
	admit := func(name string, opts ...system.WaitOption) {
		go func() {
			_, _, err := sys.Admit(ctx, system.Request{Name: name, Reservations: []system.ReservationSpec{{Name: name, Location: "cuda:0", Bytes: 1 << 10}}}, opts...)
			done <- err
		}()
		waitFor(t, func() bool { return len(sys.Waiters()) > 0 && contains(sys.Waiters(), name) })
	}
	admit("low", system.WaitForRoom())
	admit("high", system.WaitClass(5))
	admit("bypassing", system.WaitAllowBypass())
	t.Cleanup(func() {
		cancel()
		for range 3 {
			<-done
		}
		_ = holder.Exit(context.Background())
	})
	srv := mount(t, sys)
	_, body := do(t, http.MethodGet, srv.URL+prefix+"/waiters")
	var got struct {
		Waiters []waiterJSON `json:"waiters"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	var names []string
	var eligible []bool
	for _, w := range got.Waiters {
		names = append(names, w.Name)
		eligible = append(eligible, w.Eligible)
	}
	assert.Equal(t, []string{"high", "low", "bypassing"}, names)
	assert.Equal(t, []bool{true, false, false}, eligible, "high, at the head, holds up the rest at cuda:0")
	assert.True(t, got.Waiters[2].AllowBypass)
}

func contains(ws []system.WaiterInfo, name string) bool {
	for _, w := range ws {
		if w.Name == name {
			return true
		}
	}
	return false
}

// waitFor waits until cond holds (it reads a state that has no signal to
// wait on), or fails after a generous deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out")
		time.Sleep(time.Millisecond)
	}
}
