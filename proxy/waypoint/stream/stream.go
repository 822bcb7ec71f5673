// Package stream holds what the waypoint's filters tell each other about
// one request or TCP stream, as Envoy's StreamInfo: what authentication
// proved (RequestAuth), the attributes authorization reads (Attrs), what
// authorization decided (Verdict), and a refusal with the status to answer
// (Refusal). Filter packages import this one, never each other; the root
// package proxy/waypoint runs the filters in their order.
package stream

import (
	"net/netip"
	"strings"
)

// RequestAuth is the identity a valid JWT gave a request.
type RequestAuth struct {
	// Principal is "<iss>/<sub>", Istio's request principal.
	Principal string
	Audiences []string
	// Presenter is the azp claim.
	Presenter string
	// Claims is the token's payload.
	Claims map[string]any
}

// Claim is the claim at a nested path of the payload.
func (a *RequestAuth) Claim(path []string) (any, bool) {
	var cur any = a.Claims
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// ClaimValues are the strings a `request.auth.claims[...]` condition
// compares: a string claim (split on spaces for scope and permission, as
// Istio does), or the strings of a list claim. An anonymous request (a nil
// a) has none.
func (a *RequestAuth) ClaimValues(path []string) []string {
	if a == nil || len(path) == 0 {
		return nil
	}
	v, ok := a.Claim(path)
	if !ok {
		return nil
	}
	switch x := v.(type) {
	case string:
		if len(path) == 1 && (path[0] == "scope" || path[0] == "permission") {
			return strings.Fields(x)
		}
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// Attrs is what authorization sees of one request (or TCP connection).
type Attrs struct {
	// Principal is the client's SPIFFE id without "spiffe://"; Namespace
	// its namespace ("" for an unauthenticated client, which cannot occur
	// behind mTLS).
	Principal, Namespace string
	SrcIP, DstIP         netip.Addr
	DstPort              uint16
	// Service is the hostname of the addressed service ("" for a workload).
	Service string
	// HTTP is false for plain TCP: rules using HTTP fields never match as
	// ALLOW and always match as DENY there (fail closed).
	HTTP               bool
	Host, Method, Path string
	Header             func(name string) (string, bool)
	// Auth is what a valid JWT said (authentication); nil: anonymous.
	Auth *RequestAuth
}

// RequestPrincipal is the JWT's "iss/sub" ("": anonymous).
func (a *Attrs) RequestPrincipal() string {
	if a.Auth == nil {
		return ""
	}
	return a.Auth.Principal
}

// Verdict is the outcome of authorization.
type Verdict struct {
	Allow bool
	// Policy names the deciding policy ("ns/name"); "" when no policy
	// selected the request (allowed) or when no ALLOW matched (see Reason).
	Policy string
	Reason string
	// DryRun lists "ns/name=allow|deny" of dry-run and AUDIT policies that
	// matched, for the access log; never enforced.
	DryRun []string
}

// Refusal is a request (or stream) a filter answered itself instead of
// sending it upstream: Code is the HTTP status to answer, Body what to
// answer instead of the status text ("": the status text), Flag the
// response flag of the access log and metrics ("": the status's own).
type Refusal struct {
	Code int
	Msg  string
	Body string
	Flag string
}

func (e *Refusal) Error() string { return e.Msg }
