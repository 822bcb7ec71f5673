// Package zdsapi holds the generated Go types of ZDS (proto package
// istio.workload.zds), the protocol the CNI node agent and ztunnel speak over
// the /var/run/ztunnel/ztunnel.sock SOCK_SEQPACKET socket, one message per
// datagram.
//
// The types are generated from zds.proto by hack/proto/gen.sh; edit the
// .proto, never the .pb.go. It holds no logic: framing, file-descriptor
// passing and the snapshot/ack state machine live in the ZDS client and server
// packages.
package zdsapi
