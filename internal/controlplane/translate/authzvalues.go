package translate

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
)

// problems collects the values of one policy that cannot be enforced, each
// as "<field path>: <why>", the path in the YAML's own names
// (spec.rules[0].from[1].source.ipBlocks[2]).
type problems []string

func (p *problems) addf(path, format string, args ...any) {
	*p = append(*p, path+": "+fmt.Sprintf(format, args...))
}

func fieldAt(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// stringMatches converts principals or namespaces: "*" is presence, "*x" a
// suffix, "x*" a prefix, else exact. Empty values and a wildcard anywhere
// else are invalid (Istio's validation rejects them); so is a principal
// with a URI scheme ("spiffe://..."): principals are compared without it,
// so such a value could never match.
func stringMatches(path string, vs []string, principal bool, bad *problems) []*securityapi.StringMatch {
	var out []*securityapi.StringMatch
	for i, v := range vs {
		if !validWildcard(fieldAt(path, i), v, bad) {
			continue
		}
		if principal && strings.Contains(v, "://") {
			bad.addf(fieldAt(path, i), "%q has a URI scheme; principals are written without it (cluster.local/ns/<ns>/sa/<sa>)", v)
			continue
		}
		var m securityapi.StringMatch
		switch {
		case v == "*":
			m.MatchType = &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}
		case strings.HasPrefix(v, "*"):
			m.MatchType = &securityapi.StringMatch_Suffix{Suffix: v[1:]}
		case strings.HasSuffix(v, "*"):
			m.MatchType = &securityapi.StringMatch_Prefix{Prefix: v[:len(v)-1]}
		default:
			m.MatchType = &securityapi.StringMatch_Exact{Exact: v}
		}
		out = append(out, &m)
	}
	return out
}

func validWildcard(path, v string, bad *problems) bool {
	switch n := strings.Count(v, "*"); {
	case v == "":
		bad.addf(path, "empty value")
	case n > 1:
		bad.addf(path, "%q has more than one wildcard", v)
	case n == 1 && !strings.HasPrefix(v, "*") && !strings.HasSuffix(v, "*"):
		bad.addf(path, "%q has a wildcard that is neither at the start nor at the end", v)
	default:
		return true
	}
	return false
}

// addresses parses IPs and CIDRs (a CIDR's host bits are cleared).
func addresses(path string, vs []string, bad *problems) []*securityapi.Address {
	var out []*securityapi.Address
	for i, v := range vs {
		if strings.Contains(v, "/") {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				bad.addf(fieldAt(path, i), "%q is not a CIDR", v)
				continue
			}
			p = p.Masked()
			out = append(out, &securityapi.Address{Address: addrBytes(p.Addr()), Length: uint32(p.Bits())})
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" {
			bad.addf(fieldAt(path, i), "%q is not an IP address", v)
			continue
		}
		out = append(out, &securityapi.Address{Address: addrBytes(a), Length: uint32(a.BitLen())})
	}
	return out
}

// ports parses decimal ports 0-65535, as Istio's validation accepts.
func ports(path string, vs []string, bad *problems) []uint32 {
	var out []uint32
	for i, v := range vs {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			bad.addf(fieldAt(path, i), "%q is not a port number (0-65535)", v)
			continue
		}
		out = append(out, uint32(p))
	}
	return out
}

// serviceAccounts parses "ns/sa" or "sa" (policy namespace); no wildcards.
func serviceAccounts(path, ns string, vs []string, bad *problems) []*securityapi.ServiceAccountMatch {
	var out []*securityapi.ServiceAccountMatch
	for i, v := range vs {
		n, sa, ok := strings.Cut(v, "/")
		if !ok {
			n, sa = ns, v
		}
		switch {
		case strings.Contains(v, "*"):
			bad.addf(fieldAt(path, i), "%q: service accounts take no wildcard", v)
		case n == "" || sa == "" || strings.Contains(sa, "/"):
			bad.addf(fieldAt(path, i), "%q is not <serviceAccount> or <namespace>/<serviceAccount>", v)
		default:
			out = append(out, &securityapi.ServiceAccountMatch{Namespace: n, ServiceAccount: sa})
			continue
		}
	}
	return out
}

// whenKind classifies a `when` key: node proxies evaluate the L4 keys; the
// L7 keys (Istio's other attributes) are for waypoints; anything else is
// not an attribute Istio knows and makes the rule invalid.
func whenKind(key string) (l4, l7 bool) {
	switch key {
	case "source.ip", "source.namespace", "source.principal", "source.serviceAccount",
		"destination.ip", "destination.port":
		return true, false
	case "remote.ip", "source.trustDomain", "request.auth.principal", "request.auth.audiences",
		"request.auth.presenter", "connection.sni":
		return false, true
	}
	for _, p := range []string{"request.headers[", "request.auth.claims[", "experimental.envoy.filters."} {
		if strings.HasPrefix(key, p) && (strings.HasPrefix(p, "experimental") || strings.HasSuffix(key, "]") && len(key) > len(p)+1) {
			return false, true
		}
	}
	return false, false
}
