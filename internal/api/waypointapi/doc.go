// Package waypointapi holds the generated Go types of ztunnel-go's own
// waypoint configuration (proto package ztunnelgo.waypoint): one Config per
// waypoint Gateway with the services and workloads bound to it, the
// AuthorizationPolicies (with L7 fields) that apply there and the HTTPRoutes
// attached to its services, all pre-resolved by the control plane. It is
// served over the same delta xDS stream as the workload API as
// type.googleapis.com/ztunnelgo.waypoint.Config (see docs/protocol.md,
// "Waypoint config (ours)"); a waypoint subscribes to its own resource name
// ("<namespace>/<name>" of its Gateway) only.
//
// The types are generated from waypoint.proto by hack/proto/gen.sh; edit the
// .proto, never the .pb.go. The type is ours, not Istio's: istiod configures
// its Envoy waypoints through Envoy's xDS, and no Istio component reads it.
//
// It holds no logic: the waypoint data path (proxy/waypoint) evaluates it and
// the control plane (internal/controlplane/translate) builds it.
package waypointapi

// TypeURL is the delta xDS type of Config.
const TypeURL = "type.googleapis.com/ztunnelgo.waypoint.Config"
