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

// AuditExtension is the name of the Extension (no config) ztunnel-go's
// control plane puts on an AUDIT AuthorizationPolicy. The wire has no AUDIT
// action, so the policy goes out as a dry-run DENY carrying this marker:
// any node proxy evaluates it without enforcing it (Istio's ztunnel logs a
// dry-run match), and ztunnel-go's reports the match as audited rather than
// as "would deny".
const AuditExtension = "ztunnel-go.io/audit"
