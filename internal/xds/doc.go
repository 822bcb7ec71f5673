// Package xds is ztunnel-go's delta ADS client, the node proxy's and the
// waypoint's transport for Istio's workload discovery
// (type.googleapis.com/istio.workload.Address) and L4 authorization
// (type.googleapis.com/istio.security.Authorization) resources, and the
// names both ends share: the type URLs and the status report
// (StreamStatus) ztunnel-cp's server serves and zctl reads.
//
// The Client subscribes to both types as a wildcard, decodes every resource
// into its generated proto, hands the batch to a Sink (internal/node/state), ACKs
// or NACKs each response, tracks the accepted per-resource versions and
// resumes with initial_resource_versions after a reconnect.
//
// A waypoint's client (ClientConfig.Waypoint) also subscribes to
// ztunnel-go's own WaypointType (internal/api/waypointapi) with exactly its
// own resource name, so it receives its config and no other waypoint's; node
// proxies never subscribe to that type.
//
// The client encodes its DeltaDiscoveryRequests and decodes the
// DeltaDiscoveryResponses itself (wire.go) rather than through
// go-control-plane's generated types, so that the binaries that link this
// package do not link go-control-plane: as of 2026-12-06 that leaves
// 0.95 MiB of .text, .rodata and .gopclntab (and the descriptors the
// generated packages register at init) out of the node proxy. The server,
// internal/controlplane/xdsserver, keeps go-control-plane.
//
// It is not the state store and does not validate the semantics of a
// resource (unknown enum values, bad addresses): that is the Sink's job.
package xds
