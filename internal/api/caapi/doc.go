// Package caapi holds the generated Go types and gRPC client/server stubs of
// Istio's certificate signing service (proto package istio.v1.auth,
// IstioCertificateService/CreateCertificate), the API istiod's CA serves on
// port 15012.
//
// The code is generated from ca.proto by hack/proto/gen.sh; edit the .proto,
// never the .pb.go. It holds no logic: CSR creation, rotation and the CA
// server live in internal/identity.
package caapi
