package translate

import (
	"net/netip"
	"strconv"
	"strings"

	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// convertWaypointPolicy converts an AuthorizationPolicy for a waypoint, L7
// fields included, reading every field as Istio's authorization.proto
// defines it. It returns the values that cannot be enforced ("field:
// why"), which fail closed: an ALLOW (or AUDIT) rule holding one is dropped,
// so it allows less; a DENY rule holding one matches every request. Each
// such rule adds an entry saying which of the two happened.
func convertWaypointPolicy(ap *securityv1.AuthorizationPolicy) (*waypointapi.Policy, []string) {
	p := &waypointapi.Policy{Name: ap.Name, Namespace: ap.Namespace}
	var bad problems
	switch ap.Spec.Action {
	case securityv1beta1.AuthorizationPolicy_ALLOW:
		p.Action = waypointapi.Action_ALLOW
	case securityv1beta1.AuthorizationPolicy_DENY:
		p.Action = waypointapi.Action_DENY
	case securityv1beta1.AuthorizationPolicy_AUDIT:
		p.Action, p.DryRun = waypointapi.Action_AUDIT, true
	default:
		// CUSTOM (ext_authz) has no provider here: deny everything.
		bad.addf("spec.action", "%s is not supported by ztunnel-go's waypoint; the policy denies every request", ap.Spec.Action)
		p.Action, p.Rules = waypointapi.Action_DENY, []*waypointapi.Rule{{}}
		return p, bad
	}
	// Istio's validation allows a provider only with action CUSTOM, which
	// is refused above: a provider beside another action is a policy istiod
	// would reject, so it may not be read as if the provider were absent.
	if ap.Spec.GetProvider() != nil {
		if p.Action == waypointapi.Action_DENY {
			bad.addf("spec.provider", "a provider goes only with action CUSTOM; this DENY policy matches every request (fail closed)")
			p.Rules = []*waypointapi.Rule{{}}
		} else {
			bad.addf("spec.provider", "a provider goes only with action CUSTOM; this %s policy's rules are dropped (fail closed: allows less)", p.Action)
			p.Rules = nil
		}
		return p, bad
	}
	if v, ok := ap.Annotations[AnnotationDryRun]; ok {
		dry, err := strconv.ParseBool(v)
		if err != nil {
			bad.addf("metadata.annotations["+AnnotationDryRun+"]", "%q is not true or false; the policy is enforced", v)
		}
		p.DryRun = p.DryRun || dry
	}
	for i, r := range ap.Spec.Rules {
		path := fieldAt("spec.rules", i)
		before := len(bad)
		wr := convertWaypointRule(ap.Namespace, path, r, &bad)
		switch {
		case len(bad) == before:
			p.Rules = append(p.Rules, wr)
		case p.Action == waypointapi.Action_DENY:
			p.Rules = append(p.Rules, &waypointapi.Rule{}) // matches every request
			bad.addf(path, "this DENY rule matches every request (fail closed)")
		default:
			bad.addf(path, "this %s rule is dropped (fail closed: allows less)", p.Action)
		}
	}
	return p, bad
}

// convertWaypointRule converts one rule, adding every value it cannot
// enforce to bad. Istio's validation rejects what it flags here (null or
// empty from/to entries, serviceAccounts next to principals or namespaces,
// malformed values); the waypoint may not read such a rule more widely than
// istiod would have let it exist.
func convertWaypointRule(ns, path string, r *securityv1beta1.Rule, bad *problems) *waypointapi.Rule {
	wr := &waypointapi.Rule{}
	if r == nil {
		bad.addf(path, "a rule must not be null")
		return wr
	}
	if r.From != nil && len(r.From) == 0 {
		bad.addf(path+".from", "must not be empty")
	}
	if r.To != nil && len(r.To) == 0 {
		bad.addf(path+".to", "must not be empty")
	}
	for i, f := range r.From {
		fp := fieldAt(path+".from", i) + ".source"
		s := f.GetSource()
		if s == nil {
			bad.addf(fp, "must be set")
			continue
		}
		wr.From = append(wr.From, waypointSource(ns, fp, s, bad))
	}
	for i, t := range r.To {
		op := fieldAt(path+".to", i) + ".operation"
		o := t.GetOperation()
		if o == nil {
			bad.addf(op, "must be set")
			continue
		}
		wr.To = append(wr.To, waypointOperation(op, o, bad))
	}
	for i, c := range r.When {
		if cond := waypointCondition(ns, fieldAt(path+".when", i), c, bad); cond != nil {
			wr.When = append(wr.When, cond)
		}
	}
	return wr
}

func waypointSource(ns, fp string, s *securityv1beta1.Source, bad *problems) *waypointapi.Source {
	if len(s.Principals)+len(s.NotPrincipals)+len(s.Namespaces)+len(s.NotNamespaces) > 0 &&
		len(s.ServiceAccounts)+len(s.NotServiceAccounts) > 0 {
		bad.addf(fp, "serviceAccounts cannot be set with principals or namespaces")
	}
	out := &waypointapi.Source{
		Principals:           wpMatches(fp+".principals", s.Principals, kindPrincipal, bad),
		NotPrincipals:        wpMatches(fp+".notPrincipals", s.NotPrincipals, kindPrincipal, bad),
		Namespaces:           wpMatches(fp+".namespaces", s.Namespaces, kindWildcard, bad),
		NotNamespaces:        wpMatches(fp+".notNamespaces", s.NotNamespaces, kindWildcard, bad),
		IpBlocks:             wpCidrs(fp+".ipBlocks", s.IpBlocks, bad),
		NotIpBlocks:          wpCidrs(fp+".notIpBlocks", s.NotIpBlocks, bad),
		RemoteIpBlocks:       wpCidrs(fp+".remoteIpBlocks", s.RemoteIpBlocks, bad),
		NotRemoteIpBlocks:    wpCidrs(fp+".notRemoteIpBlocks", s.NotRemoteIpBlocks, bad),
		RequestPrincipals:    wpMatches(fp+".requestPrincipals", s.RequestPrincipals, kindWildcard, bad),
		NotRequestPrincipals: wpMatches(fp+".notRequestPrincipals", s.NotRequestPrincipals, kindWildcard, bad),
		ServiceAccounts:      wpServiceAccounts(fp+".serviceAccounts", ns, s.ServiceAccounts, bad),
		NotServiceAccounts:   wpServiceAccounts(fp+".notServiceAccounts", ns, s.NotServiceAccounts, bad),
		TrustDomains:         wpMatches(fp+".trustDomains", s.TrustDomains, kindWildcard, bad),
		NotTrustDomains:      wpMatches(fp+".notTrustDomains", s.NotTrustDomains, kindWildcard, bad),
	}
	if len(s.Principals)+len(s.NotPrincipals)+len(s.Namespaces)+len(s.NotNamespaces)+len(s.IpBlocks)+len(s.NotIpBlocks)+
		len(s.RemoteIpBlocks)+len(s.NotRemoteIpBlocks)+len(s.RequestPrincipals)+len(s.NotRequestPrincipals)+
		len(s.ServiceAccounts)+len(s.NotServiceAccounts)+len(s.TrustDomains)+len(s.NotTrustDomains) == 0 {
		bad.addf(fp, "must not be empty")
	}
	return out
}

func waypointOperation(op string, o *securityv1beta1.Operation, bad *problems) *waypointapi.Operation {
	if len(o.Hosts)+len(o.NotHosts)+len(o.Ports)+len(o.NotPorts)+len(o.Methods)+len(o.NotMethods)+len(o.Paths)+len(o.NotPaths) == 0 {
		bad.addf(op, "must not be empty")
	}
	return &waypointapi.Operation{
		Hosts: wpMatches(op+".hosts", o.Hosts, kindHost, bad), NotHosts: wpMatches(op+".notHosts", o.NotHosts, kindHost, bad),
		Ports: ports(op+".ports", o.Ports, bad), NotPorts: ports(op+".notPorts", o.NotPorts, bad),
		Methods: wpMatches(op+".methods", o.Methods, kindMethod, bad), NotMethods: wpMatches(op+".notMethods", o.NotMethods, kindMethod, bad),
		Paths: wpMatches(op+".paths", o.Paths, kindPath, bad), NotPaths: wpMatches(op+".notPaths", o.NotPaths, kindPath, bad),
	}
}

// waypointCondition converts one `when` entry, parsing its values as the
// key's type says; nil when the key is not one the waypoint evaluates.
func waypointCondition(ns, cp string, c *securityv1beta1.Condition, bad *problems) *waypointapi.Condition {
	if c == nil {
		bad.addf(cp, "must not be null")
		return nil
	}
	key := c.GetKey()
	if len(c.Values) == 0 && len(c.NotValues) == 0 {
		bad.addf(cp, "condition on %q has neither values nor notValues", key)
	}
	vs, nvs := cp+".values", cp+".notValues"
	out := &waypointapi.Condition{Key: key}
	conv := func(f func(path string, v []string) []*waypointapi.StringMatch) {
		out.Values, out.NotValues = f(vs, c.Values), f(nvs, c.NotValues)
	}
	switch {
	case key == "source.ip" || key == "remote.ip" || key == "destination.ip":
		conv(func(p string, v []string) []*waypointapi.StringMatch { return wpCidrStrings(p, v, bad) })
	case key == "destination.port":
		conv(func(p string, v []string) []*waypointapi.StringMatch { return exacts(ports(p, v, bad)) })
	case key == "source.namespace" || key == "source.trustDomain":
		conv(func(p string, v []string) []*waypointapi.StringMatch { return wpMatches(p, v, kindWildcard, bad) })
	case key == "source.principal":
		conv(func(p string, v []string) []*waypointapi.StringMatch { return wpMatches(p, v, kindPrincipal, bad) })
	case key == "source.serviceAccount":
		conv(func(p string, v []string) []*waypointapi.StringMatch {
			var out []*waypointapi.StringMatch
			for _, sa := range wpServiceAccounts(p, ns, v, bad) {
				out = append(out, exact(sa.Namespace+"/"+sa.Name))
			}
			return out
		})
	case strings.HasPrefix(key, "request.headers["):
		if name, ok := bracketName(key, "request.headers["); !ok || !validHeaderName(name) {
			bad.addf(cp+".key", "%q is not request.headers[<header name>]", key)
			return nil
		}
		conv(func(p string, v []string) []*waypointapi.StringMatch { return wpMatches(p, v, kindHeader, bad) })
	case key == "request.auth.principal" || key == "request.auth.audiences" || key == "request.auth.presenter":
		conv(func(p string, v []string) []*waypointapi.StringMatch { return wpMatches(p, v, kindHeader, bad) })
	case strings.HasPrefix(key, claimsPrefix):
		if !validClaimKey(key) {
			bad.addf(cp+".key", "%q is not request.auth.claims[<claim>] (nested: [a][b])", key)
			return nil
		}
		conv(func(p string, v []string) []*waypointapi.StringMatch { return wpMatches(p, v, kindHeader, bad) })
	case key == "connection.sni":
		bad.addf(cp+".key", "connection.sni is not enforced: the waypoint receives requests inside HBONE, where no client TLS handshake (and so no SNI) reaches it")
		return nil
	case strings.HasPrefix(key, "experimental.envoy.filters."):
		bad.addf(cp+".key", "%q names Envoy filter metadata, which ztunnel-go's waypoint does not have", key)
		return nil
	default:
		bad.addf(cp+".key", "%q is not an attribute ztunnel-go's waypoint evaluates", key)
		return nil
	}
	return out
}

// matchKind says how a value of a policy field is read.
type matchKind int

const (
	// kindWildcard: "*", "x*", "*x" or exact; one wildcard, at an end.
	kindWildcard matchKind = iota
	// kindPrincipal: kindWildcard without a URI scheme (Istio prepends
	// "spiffe://", so "spiffe://..." could never match).
	kindPrincipal
	// kindHost: kindWildcard, compared case-insensitively.
	kindHost
	// kindMethod: kindWildcard; methods are case-sensitive and the waypoint
	// refuses (400) a request whose method is not upper case, as Istio
	// documents, so a value with a lower-case letter could never match.
	kindMethod
	// kindPath: kindWildcard; Istio's path templates ({*}, {**}) are not
	// evaluated by the waypoint.
	kindPath
	// kindHeader: Istio's header matcher: "*" presence, a leading "*"
	// suffix, a trailing "*" prefix, else exact (no other check).
	kindHeader
)

// wpMatches converts Istio's string forms after validating each value as k
// says: "*" presence, "*x" suffix, "x*" prefix, else exact.
func wpMatches(path string, vs []string, k matchKind, bad *problems) []*waypointapi.StringMatch {
	var out []*waypointapi.StringMatch
	for i, v := range vs {
		vp := fieldAt(path, i)
		switch {
		case v == "":
			bad.addf(vp, "empty value")
			continue
		case k != kindHeader && !validWildcard(vp, v, bad):
			continue
		case k == kindPrincipal && strings.Contains(v, "://"):
			bad.addf(vp, "%q has a URI scheme; principals are written without it (cluster.local/ns/<ns>/sa/<sa>)", v)
			continue
		case k == kindMethod && strings.ToUpper(v) != v:
			bad.addf(vp, "%q is not upper case: methods match case-sensitively and requests with a lower-case method are refused, so it never matches (write %q)", v, strings.ToUpper(v))
			continue
		case k == kindPath && strings.ContainsAny(v, "{}"):
			bad.addf(vp, "%q: path templates ({*}, {**}) are not supported by ztunnel-go's waypoint", v)
			continue
		case k == kindPath && v != "*" && !strings.HasPrefix(v, "/") && !strings.HasPrefix(v, "*"):
			bad.addf(vp, "%q does not start with /: request paths always do, so it never matches", v)
			continue
		}
		if k == kindHost {
			v = strings.ToLower(v)
		}
		var m waypointapi.StringMatch
		switch {
		case v == "*":
			m.MatchType = &waypointapi.StringMatch_Presence{Presence: true}
		case strings.HasPrefix(v, "*"):
			m.MatchType = &waypointapi.StringMatch_Suffix{Suffix: v[1:]}
		case strings.HasSuffix(v, "*"):
			m.MatchType = &waypointapi.StringMatch_Prefix{Prefix: v[:len(v)-1]}
		default:
			m.MatchType = &waypointapi.StringMatch_Exact{Exact: v}
		}
		out = append(out, &m)
	}
	return out
}

func exact(v string) *waypointapi.StringMatch {
	return &waypointapi.StringMatch{MatchType: &waypointapi.StringMatch_Exact{Exact: v}}
}

func exacts(ps []uint32) []*waypointapi.StringMatch {
	var out []*waypointapi.StringMatch
	for _, p := range ps {
		out = append(out, exact(strconv.FormatUint(uint64(p), 10)))
	}
	return out
}

func wpServiceAccounts(path, ns string, vs []string, bad *problems) []*waypointapi.ServiceAccount {
	if len(vs) > 16 {
		bad.addf(path, "more than 16 values (Istio's limit)")
	}
	for i, v := range vs {
		if len(v) > 320 {
			bad.addf(fieldAt(path, i), "longer than 320 characters (Istio's limit)")
		}
	}
	var out []*waypointapi.ServiceAccount
	for _, m := range serviceAccounts(path, ns, vs, bad) {
		out = append(out, &waypointapi.ServiceAccount{Namespace: m.Namespace, Name: m.ServiceAccount})
	}
	return out
}

// parsePrefix reads an IP or a CIDR as Istio's validation does; a CIDR's
// host bits are cleared.
func parsePrefix(v string) (netip.Prefix, bool) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		return p.Masked(), err == nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, a.BitLen()), true
}

func wpCidrs(path string, vs []string, bad *problems) []*waypointapi.Cidr {
	var out []*waypointapi.Cidr
	for i, v := range vs {
		pfx, ok := parsePrefix(v)
		if !ok {
			bad.addf(fieldAt(path, i), "%q is not an IP or CIDR", v)
			continue
		}
		out = append(out, &waypointapi.Cidr{Address: pfx.Addr().AsSlice(), Length: uint32(pfx.Bits())})
	}
	return out
}

// wpCidrStrings validates the values of an ip key and sends each in its
// canonical CIDR form, so the waypoint never meets one it cannot parse.
func wpCidrStrings(path string, vs []string, bad *problems) []*waypointapi.StringMatch {
	var out []*waypointapi.StringMatch
	for i, v := range vs {
		pfx, ok := parsePrefix(v)
		if !ok {
			bad.addf(fieldAt(path, i), "%q is not an IP or CIDR", v)
			continue
		}
		out = append(out, exact(pfx.String()))
	}
	return out
}

// bracketName returns x of prefix + "x]".
func bracketName(key, prefix string) (string, bool) {
	if !strings.HasPrefix(key, prefix) || !strings.HasSuffix(key, "]") || len(key) <= len(prefix)+1 {
		return "", false
	}
	return key[len(prefix) : len(key)-1], true
}

// validHeaderName: an RFC 9110 token.
func validHeaderName(n string) bool {
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return n != ""
}

const claimsPrefix = "request.auth.claims["

// validClaimKey reports whether k is request.auth.claims[a] or a nested
// request.auth.claims[a][b]..., as Istio spells JWT claims.
func validClaimKey(k string) bool {
	if !strings.HasPrefix(k, claimsPrefix) || !strings.HasSuffix(k, "]") {
		return false
	}
	for _, p := range strings.Split(k[len(claimsPrefix):len(k)-1], "][") {
		if p == "" || strings.ContainsAny(p, "[]") {
			return false
		}
	}
	return true
}
