// Package certmanager is the node proxy's certificate manager: it fetches
// workload certificates from the Istio CA (CreateCertificate over gRPC, with a
// CSR per identity), caches them, prefetches them for the identities the node
// proxy says it needs, renews them at half-life, and retries failures with
// per-identity exponential backoff while the previous certificate keeps
// serving. A *Manager is an identity.CertSource.
//
// It is not a CA (see internal/controlplane/ca), it does not decide which
// identities are needed (the caller's state watcher does, through SetWanted,
// Track and Forget), and it does not serve TLS.
package certmanager
