package cluster_test

import (
	"context"
	"testing"

	testprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/test"

	"github.com/residency-go/residency/system"
	"github.com/residency-go/residency/system/cluster"
)

// A malformed AdvertisedAddr is refused before the runtime starts or the
// node joins. (Nodes that advertise a proxy's address run in
// tests/clusterproc's fault tests: every request to them goes through it.)
func TestStartNodeRefusesMalformedAdvertisedAddr(t *testing.T) {
	prov := testprovider.NewTestProvider(testprovider.NewInMemAgent())
	for _, addr := range []string{"no-port", ":7000", "127.0.0.1:"} {
		_, err := cluster.StartNode(context.Background(), cluster.NodeOptions{Name: "node-a", Provider: prov, AdvertisedAddr: addr,
			Options: locs(system.NoLimit("pageable-host"))})
		requireInvalid(t, err, "advertised address")
	}
}
