// Package clusterpb holds the protobuf messages that cross cluster nodes
// (package system/cluster): everything one node sends another, and
// nothing else. The in-process messages that actors exchange inside one
// runtime are in package messages; these are their wire-side neighbours,
// kept apart so that a single-node program never links them.
//
// The definitions are in cluster.proto (protobuf package
// residency.cluster.v1; the file is registered as
// messages/clusterpb/cluster.proto, since protoactor already registers a
// file named cluster.proto). cluster.pb.go is generated and committed:
// after editing the .proto, run `make proto`, which regenerates it and
// writes cluster_proto_stamp.go. TestClusterProtoUpToDate checks, without
// protoc, that both files are what make proto produced.
//
// By feature:
//
//   - remote sources: [OpenStream], [ReadChunk] and [Chunk], [CloseStream];
//   - the directory: [DirectoryUpdate], [WhereIs] and [WhereIsReply];
//   - location summaries gossiped by every node: [NodeSummary];
//   - placement: [AdmitPlacement] (the caller's placement id and wait),
//     [AdmitPlacementReply] (the node's decision), [ReleasePlacement];
//   - remote leases: [AcquireLease], [ReleaseLease];
//   - [RemoteError], which carries each typed error of the runtime across
//     nodes, so that the receiver rebuilds the same Go type.
//
// A message is marshalled with google.golang.org/protobuf, as protoactor's
// remote layer does; see the example.
package clusterpb
