// Package proxy is the node proxy's data path: the listeners it opens inside
// each captured pod's network namespace (outbound 15001, inbound plaintext
// 15006, inbound HBONE 15008), the routing decision for each connection, L4
// authorization at the destination, and the one result record (metrics and
// access log) that every connection produces.
//
// It reads node state through immutable snapshots and never talks to the
// control plane, the CA or Kubernetes itself.
package proxy
