package cluster_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/residency-go/residency/system"
)

func TestSmoke(t *testing.T) {
	c := startNodes(t,
		system.NodeOptions{Name: "node-a", Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20))},
		system.NodeOptions{Name: "node-b", Options: locs(system.NoLimit("pageable-host"), system.Limit("cuda:0", 1<<20))},
	)
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	a, b := c.nodes["node-a"], c.nodes["node-b"]
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5}, 1000)
	ha, err := a.System().Register(ctx, system.Value{Name: "w", Bytes: int64(len(data)), At: "cuda:0", Data: data})
	require.NoError(t, err)
	hb, err := b.RegisterRemote(ctx, system.Value{Name: "w", Bytes: int64(len(data)), Source: "pageable-host"}, system.RemoteSource{Node: "node-a", Handle: ha})
	require.NoError(t, err)
	require.NoError(t, b.System().Place(ctx, hb, "cuda:0"))
	got, err := b.System().Read(ctx, hb, "cuda:0")
	require.NoError(t, err)
	require.Equal(t, data, got)
	require.NoError(t, a.Refresh(ctx))
	require.NoError(t, b.Refresh(ctx))
	where, err := a.WhereIs(ctx, "w")
	require.NoError(t, err)
	t.Logf("%+v", where)
	sums, err := b.Summaries(ctx)
	require.NoError(t, err)
	t.Logf("%+v", sums)
}
