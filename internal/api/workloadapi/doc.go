// Package workloadapi holds the generated Go types of Istio's workload
// discovery API (proto package istio.workload): Address, Workload, Service and
// their parts, as istiod serves them over delta xDS
// (type.googleapis.com/istio.workload.Address).
//
// The types are generated from workload.proto by hack/proto/gen.sh; edit the
// .proto, never the .pb.go. Field numbers and enum values are Istio's, so the
// package is wire-compatible with istiod and Istio's ztunnel.
//
// It holds no logic: converting these messages into ztunnel-go's own state and
// validating them is the job of internal/node/state and internal/xds.
package workloadapi
