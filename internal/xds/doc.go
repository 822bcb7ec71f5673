// Package xds is ztunnel-go's delta ADS transport: the node proxy's client and
// ztunnel-cp's server for Istio's workload discovery
// (type.googleapis.com/istio.workload.Address) and L4 authorization
// (type.googleapis.com/istio.security.Authorization) resources.
//
// The Client subscribes to both types as a wildcard, decodes every resource
// into its generated proto, hands the batch to a Sink (internal/node/state), ACKs
// or NACKs each response, tracks the accepted per-resource versions and
// resumes with initial_resource_versions after a reconnect. The Server is a
// small delta implementation on the ADS gRPC interface (go-control-plane
// provides only the protos here): the control plane replaces the whole
// desired set of a type with SetResources and only changed or removed
// resources are pushed, encoded once and shared by all streams: responses are
// written from each resource's stored encoding. For that the package
// registers, at init, gRPC's "proto" codec for the whole process, extended
// with the pre-encoded response type; every other message goes through
// gRPC's own proto codec unchanged (server_wire.go).
//
// A waypoint's client (ClientConfig.Waypoint) also subscribes to
// ztunnel-go's own WaypointType (internal/api/waypointapi) with exactly its
// own resource name, so it receives its config and no other waypoint's; node
// proxies never subscribe to that type, and it does not gate the server's
// answer to a new stream.
//
// It is not the state store and does not validate the semantics of a
// resource (unknown enum values, bad addresses): that is the Sink's job. It
// does not authenticate clients either; the caller installs gRPC interceptors.
package xds
