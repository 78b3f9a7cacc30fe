// Package providers holds the cluster providers a residency node finds
// the other members with (the Provider of cluster.NodeOptions, package
// system/cluster). It is the only package of the module that links etcd's
// client and the echo HTTP framework: a program that starts no node, or
// brings a provider of its own, never does.
//
// Two providers, each wrapping protoactor-go's:
//
//   - [Etcd]: members register under a key prefix of an etcd cluster and
//     keep the registration alive with a 3 s lease; the production choice.
//     Unlike protoactor's provider alone, it checks that etcd answers
//     before it returns (within DialTimeout), so a node pointed at a wrong
//     or dead etcd fails at once instead of hanging, and it closes its
//     etcd client when the node closes.
//   - [Automanaged]: no external service; every node serves a small HTTP
//     health check at its own address and polls its peers'. The members
//     are the nodes that answer. The check listens on the address given
//     (loopback by default), not on every interface.
//
// Use one provider per node. A node started with either:
//
//	p, err := providers.Etcd(providers.EtcdOptions{Endpoints: []string{"127.0.0.1:2379"}})
//	if err != nil { ... } // etcd did not answer within DialTimeout
//	n, err := cluster.StartNode(ctx, cluster.NodeOptions{Name: "node-a", Provider: p,
//		Options: system.Options{Locations: locations}})
//
// Several nodes in one process (tests) can use protoactor's in-memory
// provider (github.com/asynkron/protoactor-go/cluster/clusterproviders/test)
// directly. docs/cluster.md compares the providers: what each needs, how
// fast a dead member drops out.
package providers
