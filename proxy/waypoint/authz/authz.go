// Package authz is the waypoint's authorization filter: Istio's
// AuthorizationPolicy order (dry-run and AUDIT reported only, then DENY,
// then ALLOW) on the attributes of one request or TCP stream
// (stream.Attrs), with the request principal and claims authentication
// proved. On plain TCP, rules on HTTP fields or request principals never
// allow and always deny: what cannot be evaluated fails closed.
package authz

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

type stringMatch struct {
	kind  int // 0 exact, 1 prefix, 2 suffix, 3 presence
	value string
}

func (m stringMatch) match(s string) bool {
	switch m.kind {
	case 1:
		return strings.HasPrefix(s, m.value)
	case 2:
		return strings.HasSuffix(s, m.value)
	case 3:
		return s != ""
	}
	return s == m.value
}

func anyMatch(ms []stringMatch, s string) bool {
	for _, m := range ms {
		if m.match(s) {
			return true
		}
	}
	return false
}

func compileStrings(in []*waypointapi.StringMatch, fold bool) []stringMatch {
	out := make([]stringMatch, 0, len(in))
	for _, m := range in {
		var sm stringMatch
		switch v := m.GetMatchType().(type) {
		case *waypointapi.StringMatch_Exact:
			sm = stringMatch{0, v.Exact}
		case *waypointapi.StringMatch_Prefix:
			sm = stringMatch{1, v.Prefix}
		case *waypointapi.StringMatch_Suffix:
			sm = stringMatch{2, v.Suffix}
		case *waypointapi.StringMatch_Presence:
			sm = stringMatch{3, ""}
		default:
			continue // an empty match matches nothing
		}
		if fold {
			sm.value = strings.ToLower(sm.value)
		}
		out = append(out, sm)
	}
	return out
}

func compileCidrs(in []*waypointapi.Cidr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, c := range in {
		a, ok := netip.AddrFromSlice(c.GetAddress())
		if !ok {
			continue
		}
		if p, err := a.Unmap().Prefix(int(c.GetLength())); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

type source struct {
	principals, notPrincipals, namespaces, notNamespaces []stringMatch
	requestPrincipals, notRequestPrincipals              []stringMatch
	trustDomains, notTrustDomains                        []stringMatch
	serviceAccounts, notServiceAccounts                  []string // "ns/sa"
	ips, notIPs, remoteIPs, notRemoteIPs                 []netip.Prefix
}

type operation struct {
	hosts, notHosts, methods, notMethods, paths, notPaths []stringMatch
	ports, notPorts                                       []uint32
}

func (o *operation) usesHTTP() bool {
	return len(o.hosts)+len(o.notHosts)+len(o.methods)+len(o.notMethods)+len(o.paths)+len(o.notPaths) > 0
}

type condition struct {
	key               string
	values, notValues []stringMatch
	cidrs, notCidrs   []netip.Prefix // for source.ip, remote.ip, destination.ip
	claim             []string       // for request.auth.claims[a][b]: [a b]
	// broken: a value cannot be read, or there is none; the condition
	// then never holds for ALLOW and always holds for DENY.
	broken bool
}

type rule struct {
	from []source
	to   []operation
	when []condition
}

// Policy is one AuthorizationPolicy, compiled once per config.
type Policy struct {
	key      string // ns/name
	action   waypointapi.Action
	dryRun   bool
	rules    []rule
	services map[string]bool // nil: every request at this waypoint
	target   string
}

// Compile compiles one policy of the waypoint's config.
func Compile(p *waypointapi.Policy) *Policy {
	cp := &Policy{key: p.GetNamespace() + "/" + p.GetName(), action: p.GetAction(), dryRun: p.GetDryRun(), target: p.GetTarget()}
	if len(p.GetServices()) > 0 {
		cp.services = map[string]bool{}
		for _, s := range p.GetServices() {
			cp.services[s] = true
		}
	}
	for _, r := range p.GetRules() {
		var cr rule
		for _, s := range r.GetFrom() {
			cr.from = append(cr.from, source{
				principals: compileStrings(s.GetPrincipals(), false), notPrincipals: compileStrings(s.GetNotPrincipals(), false),
				namespaces: compileStrings(s.GetNamespaces(), false), notNamespaces: compileStrings(s.GetNotNamespaces(), false),
				ips: compileCidrs(s.GetIpBlocks()), notIPs: compileCidrs(s.GetNotIpBlocks()),
				remoteIPs: compileCidrs(s.GetRemoteIpBlocks()), notRemoteIPs: compileCidrs(s.GetNotRemoteIpBlocks()),
				requestPrincipals:    compileStrings(s.GetRequestPrincipals(), false),
				notRequestPrincipals: compileStrings(s.GetNotRequestPrincipals(), false),
				trustDomains:         compileStrings(s.GetTrustDomains(), false),
				notTrustDomains:      compileStrings(s.GetNotTrustDomains(), false),
				serviceAccounts:      compileAccounts(s.GetServiceAccounts()),
				notServiceAccounts:   compileAccounts(s.GetNotServiceAccounts()),
			})
		}
		for _, o := range r.GetTo() {
			cr.to = append(cr.to, operation{
				hosts: compileStrings(o.GetHosts(), true), notHosts: compileStrings(o.GetNotHosts(), true),
				methods: compileStrings(o.GetMethods(), false), notMethods: compileStrings(o.GetNotMethods(), false),
				paths: compileStrings(o.GetPaths(), false), notPaths: compileStrings(o.GetNotPaths(), false),
				ports: o.GetPorts(), notPorts: o.GetNotPorts(),
			})
		}
		for _, c := range r.GetWhen() {
			cc := condition{key: c.GetKey(), values: compileStrings(c.GetValues(), false), notValues: compileStrings(c.GetNotValues(), false)}
			if ipKey(cc.key) {
				cc.cidrs, cc.notCidrs = stringCidrs(c.GetValues()), stringCidrs(c.GetNotValues())
				cc.broken = len(cc.cidrs) != len(c.GetValues()) || len(cc.notCidrs) != len(c.GetNotValues())
			}
			// A condition without values constrains nothing in a naive
			// reading; Istio rejects it, so it fails closed here.
			cc.broken = cc.broken || len(c.GetValues())+len(c.GetNotValues()) == 0
			cc.claim = claimPath(cc.key)
			cr.when = append(cr.when, cc)
		}
		cp.rules = append(cp.rules, cr)
	}
	return cp
}

func ipKey(k string) bool { return k == "source.ip" || k == "remote.ip" || k == "destination.ip" }

const claimsKey = "request.auth.claims["

// claimPath splits Istio's request.auth.claims[a][b] into [a b]; nil for
// another key or a malformed one (which then matches nothing as ALLOW and
// everything as DENY: see condition.matches).
func claimPath(k string) []string {
	if !strings.HasPrefix(k, claimsKey) || !strings.HasSuffix(k, "]") {
		return nil
	}
	parts := strings.Split(k[len(claimsKey):len(k)-1], "][")
	for _, p := range parts {
		if p == "" || strings.ContainsAny(p, "[]") {
			return nil
		}
	}
	return parts
}

func stringCidrs(in []*waypointapi.StringMatch) []netip.Prefix {
	var out []netip.Prefix
	for _, m := range in {
		v := m.GetExact()
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, p.Masked())
		} else if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		}
	}
	return out
}

// applies reports whether the policy selects a request for service.
func (p *Policy) applies(service string) bool { return p.services == nil || p.services[service] }

func (p *Policy) matches(a *stream.Attrs) bool {
	deny := p.action == waypointapi.Action_DENY || p.action == waypointapi.Action_AUDIT
	for i := range p.rules {
		if p.rules[i].matches(a, deny) {
			return true
		}
	}
	return false
}

// matches evaluates one rule. deny: an HTTP field on a TCP connection
// matches (fail closed) instead of not matching.
func (r *rule) matches(a *stream.Attrs, deny bool) bool {
	if len(r.from) > 0 {
		ok := false
		for i := range r.from {
			if r.from[i].matches(a, deny) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.to) > 0 {
		ok := false
		for i := range r.to {
			if r.to[i].matches(a, deny) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for i := range r.when {
		if !r.when[i].matches(a, deny) {
			return false
		}
	}
	return true
}

// matches evaluates one source. deny: request principals on a TCP
// connection (no JWT can be read) match instead of not matching.
func (s *source) matches(a *stream.Attrs, deny bool) bool {
	if len(s.requestPrincipals)+len(s.notRequestPrincipals) > 0 {
		if !a.HTTP {
			return deny
		}
		rp := a.RequestPrincipal()
		if len(s.requestPrincipals) > 0 && !anyMatch(s.requestPrincipals, rp) || anyMatch(s.notRequestPrincipals, rp) {
			return false
		}
	}
	if len(s.principals) > 0 && !anyMatch(s.principals, a.Principal) || anyMatch(s.notPrincipals, a.Principal) {
		return false
	}
	if len(s.namespaces) > 0 && !anyMatch(s.namespaces, a.Namespace) || anyMatch(s.notNamespaces, a.Namespace) {
		return false
	}
	if len(s.ips) > 0 && !inAny(s.ips, a.SrcIP) || inAny(s.notIPs, a.SrcIP) {
		return false
	}
	// remote.ip is the client address Envoy trusts: with Istio's default
	// numTrustedProxies 0 (no gatewayTopology for waypoints) that is the
	// connection's peer, never X-Forwarded-For, which the client writes.
	if len(s.remoteIPs) > 0 && !inAny(s.remoteIPs, a.SrcIP) || inAny(s.notRemoteIPs, a.SrcIP) {
		return false
	}
	if len(s.trustDomains)+len(s.notTrustDomains) > 0 {
		td := trustDomain(a.Principal)
		if len(s.trustDomains) > 0 && !anyMatch(s.trustDomains, td) || anyMatch(s.notTrustDomains, td) {
			return false
		}
	}
	if len(s.serviceAccounts)+len(s.notServiceAccounts) > 0 {
		sa := serviceAccount(a.Principal)
		if len(s.serviceAccounts) > 0 && !slices.Contains(s.serviceAccounts, sa) || sa != "" && slices.Contains(s.notServiceAccounts, sa) {
			return false
		}
	}
	return true
}

func compileAccounts(in []*waypointapi.ServiceAccount) []string {
	out := make([]string, 0, len(in))
	for _, sa := range in {
		out = append(out, sa.GetNamespace()+"/"+sa.GetName())
	}
	return out
}

// serviceAccount is "ns/sa" of a principal "<td>/ns/<ns>/sa/<sa>", as
// Istio's serviceAccounts match a SPIFFE id of any trust domain; "" for
// another form (which matches no serviceAccounts value).
func serviceAccount(principal string) string {
	_, rest, ok := strings.Cut(principal, "/ns/")
	if !ok {
		return ""
	}
	ns, sa, ok := strings.Cut(rest, "/sa/")
	if !ok || ns == "" || sa == "" || strings.Contains(ns, "/") || strings.Contains(sa, "/") {
		return ""
	}
	return ns + "/" + sa
}

// trustDomain is the trust domain of a principal ("" for none).
func trustDomain(principal string) string {
	td, _, ok := strings.Cut(principal, "/")
	if !ok {
		return ""
	}
	return td
}

func (o *operation) matches(a *stream.Attrs, deny bool) bool {
	if len(o.ports) > 0 && !containsPort(o.ports, a.DstPort) || containsPort(o.notPorts, a.DstPort) {
		return false
	}
	if !a.HTTP {
		if o.usesHTTP() {
			return deny
		}
		return true
	}
	host, bare := hostForms(a.Host)
	if len(o.hosts) > 0 && !anyMatch(o.hosts, host) && !anyMatch(o.hosts, bare) ||
		anyMatch(o.notHosts, host) || anyMatch(o.notHosts, bare) {
		return false
	}
	if len(o.methods) > 0 && !anyMatch(o.methods, a.Method) || anyMatch(o.notMethods, a.Method) {
		return false
	}
	if len(o.paths) > 0 && !anyMatch(o.paths, a.Path) || anyMatch(o.notPaths, a.Path) {
		return false
	}
	return true
}

func containsPort(ps []uint32, p uint16) bool {
	for _, v := range ps {
		if v == uint32(p) {
			return true
		}
	}
	return false
}

func stripPort(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
		return h[:i]
	}
	return h
}

// hostForms is the request host lowercased, without the trailing dot of
// a fully qualified name (on the name or before the port), and the same
// without the port: "Web.NS.:80" is ("web.ns:80", "web.ns"). Both name the
// same destination, so a policy on the name covers them all (a DENY cannot
// be stepped around with "web.ns." or "WEB.ns:80").
func hostForms(h string) (host, bare string) {
	h = strings.ToLower(h)
	bare = stripPort(h)
	port := h[len(bare):]
	bare = strings.TrimSuffix(bare, ".")
	return bare + port, bare
}

func (c *condition) matches(a *stream.Attrs, deny bool) bool {
	if c.broken {
		return deny // a value the control plane let through that cannot be read
	}
	var v string
	switch {
	case ipKey(c.key):
		ip := a.SrcIP
		if c.key == "destination.ip" {
			ip = a.DstIP
		}
		return (len(c.cidrs) == 0 || inAny(c.cidrs, ip)) && !inAny(c.notCidrs, ip)
	case c.key == "source.namespace":
		v = a.Namespace
	case c.key == "source.principal":
		v = a.Principal
	case c.key == "source.serviceAccount":
		v = serviceAccount(a.Principal)
	case c.key == "source.trustDomain":
		v = trustDomain(a.Principal)
	case c.key == "destination.port":
		v = strconv.Itoa(int(a.DstPort))
	case strings.HasPrefix(c.key, "request.headers["):
		if !a.HTTP || a.Header == nil {
			return deny
		}
		v, _ = a.Header(c.key[len("request.headers[") : len(c.key)-1])
	case strings.HasPrefix(c.key, "request.auth."):
		if !a.HTTP {
			return deny // no JWT on plain TCP
		}
		vs, ok := authValues(c, a.Auth)
		if !ok {
			return deny // malformed or unknown key: fail closed
		}
		return matchAny(c.values, vs) && !matchSome(c.notValues, vs)
	default:
		return deny // unknown keys never reach here (the control plane drops them); fail closed
	}
	return (len(c.values) == 0 || anyMatch(c.values, v)) && !anyMatch(c.notValues, v)
}

// authValues are the values of a request.auth.* key for an authenticated
// request (none for an anonymous one); ok false for an unknown key.
func authValues(c *condition, auth *stream.RequestAuth) (vs []string, ok bool) {
	switch c.key {
	case "request.auth.principal":
		if auth != nil {
			vs = []string{auth.Principal}
		}
	case "request.auth.audiences":
		if auth != nil {
			vs = auth.Audiences
		}
	case "request.auth.presenter":
		if auth != nil && auth.Presenter != "" {
			vs = []string{auth.Presenter}
		}
	default:
		if c.claim == nil {
			return nil, false
		}
		vs = auth.ClaimValues(c.claim)
	}
	return vs, true
}

// matchAny: no values, or one of vs matches one of them (a claim with
// several values matches when any does, as Istio's list matcher).
func matchAny(ms []stringMatch, vs []string) bool {
	return len(ms) == 0 || matchSome(ms, vs)
}

func matchSome(ms []stringMatch, vs []string) bool {
	for _, v := range vs {
		if anyMatch(ms, v) {
			return true
		}
	}
	return false
}

// Authorize applies Istio's order: dry-run and AUDIT policies are evaluated
// and reported only; then any matching DENY denies; then, when any ALLOW
// selects the request, one must match; else the request is allowed.
func Authorize(policies []*Policy, a *stream.Attrs) stream.Verdict {
	var v stream.Verdict
	var allows []*Policy
	for _, p := range policies {
		if !p.applies(a.Service) {
			continue
		}
		if p.dryRun || p.action == waypointapi.Action_AUDIT {
			if p.matches(a) {
				outcome := "allow"
				if p.action == waypointapi.Action_DENY {
					outcome = "deny"
				} else if p.action == waypointapi.Action_AUDIT {
					outcome = "audit"
				}
				v.DryRun = append(v.DryRun, p.key+"="+outcome)
			}
			continue
		}
		switch p.action {
		case waypointapi.Action_DENY:
			if p.matches(a) {
				v.Policy, v.Reason = p.key, "denied by "+p.key
				return v
			}
		case waypointapi.Action_ALLOW:
			allows = append(allows, p)
		}
	}
	if len(allows) == 0 {
		v.Allow = true
		return v
	}
	for _, p := range allows {
		if p.matches(a) {
			v.Allow, v.Policy = true, p.key
			return v
		}
	}
	names := make([]string, len(allows))
	for i, p := range allows {
		names[i] = p.key
	}
	v.Reason = "no ALLOW policy matched (" + strings.Join(names, ", ") + ")"
	return v
}

// PolicyInfo is one policy that selects requests for a service here.
type PolicyInfo struct {
	Key    string // ns/name
	Action waypointapi.Action
	DryRun bool
	// HTTP is true when a rule reads request fields (host, method, path,
	// request headers, the JWT's request principal and claims): its match
	// then depends on the request, not only on the connection.
	HTTP bool
}

// PoliciesFor lists, in evaluation order, the policies that select
// requests for hostname ("" for a workload) at this waypoint.
func PoliciesFor(policies []*Policy, hostname string) []PolicyInfo {
	var out []PolicyInfo
	for _, p := range policies {
		if !p.applies(hostname) {
			continue
		}
		info := PolicyInfo{Key: p.key, Action: p.action, DryRun: p.dryRun}
		for _, r := range p.rules {
			for i := range r.from {
				info.HTTP = info.HTTP || len(r.from[i].requestPrincipals)+len(r.from[i].notRequestPrincipals) > 0
			}
			for i := range r.to {
				info.HTTP = info.HTTP || r.to[i].usesHTTP()
			}
			for _, w := range r.when {
				info.HTTP = info.HTTP || strings.HasPrefix(w.key, "request.")
			}
		}
		out = append(out, info)
	}
	return out
}
