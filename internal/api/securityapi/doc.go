// Package securityapi holds the generated Go types of Istio's L4 authorization
// API (proto package istio.security), as istiod serves it over delta xDS
// (type.googleapis.com/istio.security.Authorization).
//
// The types are generated from authorization.proto by hack/proto/gen.sh; edit
// the .proto, never the .pb.go. Field numbers and enum values are Istio's. Like
// Istio, the wire Action enum has only ALLOW and DENY: there is no AUDIT or
// CUSTOM.
//
// It holds no logic: policy evaluation lives elsewhere (the RBAC package).
package securityapi
