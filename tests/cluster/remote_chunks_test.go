package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// Many chunks per stream, several streams at once from one owner to two
// readers, then again one after another: every reader gets exactly the
// owner's bytes. The owner sends each chunk from a small ring of buffers
// that it reuses within a stream and across streams; a buffer reused too
// early would show here as bytes of another chunk or another value.
func TestRemoteSourceManyChunksManyStreams(t *testing.T) {
	const chunk = 4096
	const size = 97*chunk + 1234
	c := startNodes(t,
		cluster.NodeOptions{Name: "node-a", Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-b", ChunkBytes: chunk, RequestTimeout: 10 * time.Second, Options: locs(system.NoLimit("pageable-host"))},
		cluster.NodeOptions{Name: "node-c", ChunkBytes: 3 * chunk, RequestTimeout: 10 * time.Second, Options: locs(system.NoLimit("pageable-host"))},
	)
	ctx := context.Background()
	const values = 3
	data := make([][]byte, values)
	handles := make([]system.Handle, values)
	for v := range values {
		data[v] = make([]byte, size)
		for i := range data[v] {
			data[v][i] = byte(i*7 + i>>8 + v*101)
		}
		h, err := c.nodes["node-a"].System().Register(ctx, system.Value{Name: fmt.Sprintf("w%d", v), Bytes: size, At: "pageable-host", Data: data[v]})
		require.NoError(t, err)
		handles[v] = h
	}
	copyOne := func(reader string, v, round int) error {
		n := c.nodes[reader]
		h, err := n.RegisterRemote(ctx, system.Value{Name: fmt.Sprintf("r%d-%d", v, round), Bytes: size, Source: "pageable-host"},
			cluster.RemoteSource{Node: "node-a", Handle: handles[v]})
		if err != nil {
			return err
		}
		if err := n.System().Place(ctx, h, "pageable-host"); err != nil {
			return err
		}
		got, err := n.System().Read(ctx, h, "pageable-host")
		if err != nil {
			return err
		}
		if !bytes.Equal(got, data[v]) {
			i := 0
			for i < len(got) && got[i] == data[v][i] {
				i++
			}
			return fmt.Errorf("%s, value %d, round %d: bytes differ from byte %d on", reader, v, round, i)
		}
		return n.System().Discard(ctx, h)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*values*2)
	for round := range 2 {
		for _, reader := range []string{"node-b", "node-c"} {
			for v := range values {
				wg.Go(func() { errs <- copyOne(reader, v, round) })
			}
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for round := 2; round < 5; round++ {
		for _, reader := range []string{"node-b", "node-c"} {
			for v := range values {
				require.NoError(t, copyOne(reader, v, round))
			}
		}
	}
}
