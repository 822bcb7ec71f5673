// Package crl is the node proxy's certificate revocation: it loads the CRL
// bundle named by CRL_PATH (PEM with one or more "X509 CRL" blocks, or one
// DER CRL), verifies every CRL against the mesh trust roots, and answers
// whether a peer's certificate chain holds a revoked certificate, as Istio's
// ztunnel (1.29+) does with its CrlManager.
//
// The Manager keeps one immutable Set behind an atomic pointer: the TLS
// handshake of every HBONE connection (hbone.Revocation) reads it with one
// load and a map lookup per certificate. Run re-reads the file and the roots
// when either changes; a CRL that does not parse or whose signature does not
// verify against a root refuses the whole file, the error is logged and the
// last good Set keeps serving (fail closed: revocations already in force are
// never dropped by a bad update). Established connections register with
// WatchPeer; after every reload those whose peer chain the new Set revokes
// are closed, one log line and one metric increment each.
//
// What it does not do: CRLs issued by intermediate CAs (their issuer is not
// a trust root, so they are refused), delta CRLs, OCSP, and CRL distribution
// points; revocation reasons are not distinguished (every listed serial is
// revoked, including certificateHold).
package crl
