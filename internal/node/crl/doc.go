// Package crl is the node proxy's certificate revocation: it loads the CRL
// bundle named by CRL_PATH (PEM with one or more "X509 CRL" blocks, or one
// DER CRL), verifies every CRL of a mesh trust root against it at load and
// every CRL of an intermediate CA (as Istio's plugged-in CAs issue
// ca-crl.pem) against that CA's certificate in the peer's chain, and answers
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
// A CRL whose issuer names no root is such an intermediate's: it applies to
// a certificate whose issuer is the next certificate of the chain (itself
// verified up to a root by the handshake), must verify against it (else the
// peer is refused: its revocation status is unknown), and is inert for
// chains that do not pass through it, as with rustls-webpki's CRLs.
//
// What it does not do: delta CRLs, OCSP, and CRL distribution
// points; revocation reasons are not distinguished (every listed serial is
// revoked, including certificateHold).
package crl
