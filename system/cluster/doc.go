// Package cluster runs residency as a cluster: several runtimes, called
// nodes, that find each other through a cluster provider and talk over
// protoactor-go's cluster (membership, gossip, virtual actors). Each node
// is a complete runtime of its own — its own ledger, manager id, state
// version, locations and budgets, a [system.System] — and nothing about
// one node's bytes is decided by another node's ledger. What crosses
// nodes is the protobuf messages of package messages/clusterpb.
//
// The package uses only the public API of package system. A program that
// runs one node per process imports it; a program with no cluster never
// links it (nor gRPC, which the transport between nodes uses).
//
// # Starting a node
//
// [StartNode] starts the node's runtime from [NodeOptions].Options, as
// [system.Start] would, then joins the cluster through
// NodeOptions.Provider and listens on NodeOptions.Addr (loopback and a
// free port by default). The provider decides who the members are; this
// package links none, so the caller picks one:
//
//   - package system/cluster/providers: etcd (production) or the
//     automanaged provider (nodes poll each other's health checks; no
//     external service). It is the only package of the module that links
//     etcd's client and the echo HTTP framework.
//   - protoactor's in-memory test provider
//     (github.com/asynkron/protoactor-go/cluster/clusterproviders/test):
//     several nodes in one process, as this package's examples and
//     tests/cluster do.
//
// A node configures only its own memory: locations unqualified
// ("cuda:0") or qualified with its own name ("cuda:0@node-a"); one
// qualified with another node is refused. [Node.System] is the node's
// runtime, used with unqualified names like any other. [Node.Members] and
// [Node.WaitMembers] follow the member list; [Node.Close] leaves the
// cluster and closes the runtime. With NodeOptions.TLS the transport
// between members is mutual TLS.
//
// # Reading another node's bytes
//
// [Node.RegisterRemote] registers a value whose source is a value of
// another node ([RemoteSource]): placing it streams the bytes from the
// owner in chunks, while the owner keeps its copy leased and charges the
// stream buffer. [Node.AcquireRemote] takes a lease on another node's
// copy ([RemoteLease]): the owner keeps it resident and in place until
// [RemoteLease.Release].
//
// # Directory and summaries
//
// Every node publishes, at most once per RefreshInterval and at
// [Node.Refresh], where its values are resident (to the directory, one
// virtual actor per value name) and a summary of its locations' budgets
// (by gossip). [Node.WhereIs] asks the directory in one request;
// [Node.Summaries] reads the gossip, never another node's snapshot.
//
// # Placement
//
// [Node.Place] puts a [PlacementRequest] on one node, in four steps:
//
//  1. validate the request (nothing is asked when it is malformed);
//  2. gather: ask the directory where each value is resident (a lookup
//     that fails is a note, not a failure), read the summaries and the
//     member list;
//  3. rank the candidate nodes: a pure function of what was gathered, in
//     the order [PlacementCandidate] documents (the caller's tier order,
//     then values already resident, then room, then the name);
//  4. ask them in rank order, up to MaxAttempts, each attempt bounded so
//     that one hung node cannot use the caller's whole deadline; the node
//     asked decides and enters the request with its own controller
//     ([system.System.Admit]) in one step.
//
// The answer is a [Placement] with its evidence (candidates, attempts,
// the node's decision, Why in words), or a [*PlacementError] listing each
// node's reason. [Placement.Release] ends a held placement.
//
// # Errors
//
// A typed error of the runtime that happens on another node arrives as
// the same Go type ([*system.BudgetError], [*system.InUseError],
// [*system.UnavailableError], [*system.PlanError], …), so errors.As works
// across nodes. A node that is not a member, has crashed or does not
// answer in time is an [*system.UnavailableError], found within about a
// quarter of a second of the crash rather than at the request's timeout.
//
// # Tests and the race detector
//
// protoactor's cluster code reports data races of its own, so the
// examples that start nodes are built without -race only (go test
// ./system/cluster runs them); the multi-node tests are in tests/cluster
// and tests/clusterproc. docs/cluster.md is the full manual.
package cluster
