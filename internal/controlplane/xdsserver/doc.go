// Package xdsserver is ztunnel-cp's delta ADS server for the types the
// node proxies and waypoints subscribe to through internal/xds's client
// (xds.AddressType, xds.AuthorizationType, xds.WaypointType).
//
// It is a small delta implementation on the ADS gRPC interface
// (go-control-plane provides only the protos here): the control plane
// replaces the whole desired set of a type with SetResources (or changes
// part of it with UpdateResources) and only changed or removed resources
// are pushed, encoded once and shared by all streams: responses are written
// from each resource's stored encoding. For that the package registers, at
// init, gRPC's "proto" codec for the whole process, extended with the
// pre-encoded response type; every other message goes through gRPC's own
// proto codec unchanged (server_wire.go).
//
// WaypointType does not gate the server's answer to a new stream; the two
// workload API types do. It does not authenticate clients: the caller
// installs gRPC interceptors. Only ztunnel-cp links it (repotest's layout
// rules): the data-plane binaries link internal/xds, which does not import
// go-control-plane.
package xdsserver
