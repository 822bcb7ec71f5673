package translate

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
)

const kindAP = "AuthorizationPolicy"

// selectorPolicy is a WORKLOAD_SELECTOR authorization to match against
// workload labels.
type selectorPolicy struct {
	namespace string
	key       string
	selector  map[string]string
}

// l4WhenKeys are the `when` keys node proxies can evaluate.
var l4WhenKeys = map[string]bool{
	"source.ip":        true,
	"source.namespace": true,
	"source.principal": true,
	"destination.ip":   true,
	"destination.port": true,
}

func (t *translator) translateAuthorizationPolicies() {
	for _, ap := range t.objs.AuthorizationPolicies {
		key := ap.Namespace + "/" + ap.Name
		st := PolicyStatus{Kind: kindAP, Name: key}
		if refs := targetRefs(ap); len(refs) > 0 {
			st.Message = "has targetRef(s): enforced by the waypoint or gateway it targets, not sent to node proxies"
			t.attachToWaypoints(ap, refs)
			t.policies = append(t.policies, st)
			continue
		}
		switch ap.Spec.Action {
		case securityv1beta1.AuthorizationPolicy_ALLOW, securityv1beta1.AuthorizationPolicy_DENY:
		case securityv1beta1.AuthorizationPolicy_AUDIT:
			st.Message = "action AUDIT is not enforced by node proxies (it only logs, in waypoints); not sent"
			t.warnf(kindAP, ap.Namespace, ap.Name, "AUDIT is not enforced by node proxies; not sent")
			t.policies = append(t.policies, st)
			continue
		default:
			st.Message = fmt.Sprintf("action %s is not supported by node proxies; not sent", ap.Spec.Action)
			t.warnf(kindAP, ap.Namespace, ap.Name, "action %s is not supported by node proxies; not sent", ap.Spec.Action)
			t.policies = append(t.policies, st)
			continue
		}
		out, msgs := convertAuthorizationPolicy(t.cfg.RootNamespace, ap)
		for _, m := range msgs {
			t.warnf(kindAP, ap.Namespace, ap.Name, "%s", m)
		}
		st.Sent = true
		st.Message = strings.Join(msgs, "; ")
		t.policies = append(t.policies, st)
		t.authz[key] = out
		if out.Scope == securityapi.Scope_WORKLOAD_SELECTOR {
			t.selectorPolicies = append(t.selectorPolicies, selectorPolicy{
				namespace: ap.Namespace, key: key, selector: ap.Spec.Selector.GetMatchLabels(),
			})
		}
	}
}

func targetRefs(ap *securityv1.AuthorizationPolicy) []*targetRef {
	var out []*targetRef
	if r := ap.Spec.TargetRef; r != nil {
		out = append(out, &targetRef{r.Group, r.Kind, r.Name, r.Namespace})
	}
	for _, r := range ap.Spec.TargetRefs {
		out = append(out, &targetRef{r.Group, r.Kind, r.Name, r.Namespace})
	}
	return out
}

type targetRef struct{ group, kind, name, namespace string }

// attachToWaypoints records ap on the waypoints it targets (Istio 1.25
// baseline): a Gateway of class istio-waypoint in the policy's namespace, or
// GatewayClass istio-waypoint from the root namespace (every waypoint).
func (t *translator) attachToWaypoints(ap *securityv1.AuthorizationPolicy, refs []*targetRef) {
	key := ap.Namespace + "/" + ap.Name
	attached := map[string]bool{}
	for _, r := range refs {
		if r.group != "gateway.networking.k8s.io" || r.namespace != "" && r.namespace != ap.Namespace {
			continue
		}
		for _, gw := range t.objs.Gateways {
			if string(gw.Spec.GatewayClassName) != WaypointClass {
				continue
			}
			switch {
			case r.kind == "Gateway" && gw.Name == r.name && gw.Namespace == ap.Namespace,
				r.kind == "GatewayClass" && r.name == WaypointClass && ap.Namespace == t.cfg.RootNamespace:
				attached[gw.Namespace+"/"+gw.Name] = true
			}
		}
	}
	for gw := range attached {
		t.wpPols[gw] = append(t.wpPols[gw], key)
		sort.Strings(t.wpPols[gw])
	}
}

// convertAuthorizationPolicy converts an ALLOW or DENY policy without
// targetRefs (§5.4, §5.5). The messages describe dropped or omitted parts.
func convertAuthorizationPolicy(rootNs string, ap *securityv1.AuthorizationPolicy) (*securityapi.Authorization, []string) {
	scope := securityapi.Scope_WORKLOAD_SELECTOR
	if ap.Spec.Selector == nil {
		scope = securityapi.Scope_NAMESPACE
		if ap.Namespace == rootNs {
			scope = securityapi.Scope_GLOBAL
		}
	}
	action := securityapi.Action_ALLOW
	if ap.Spec.Action == securityv1beta1.AuthorizationPolicy_DENY {
		action = securityapi.Action_DENY
	}
	out := &securityapi.Authorization{Name: ap.Name, Namespace: ap.Namespace, Scope: scope, Action: action}
	var l7 []string
	dropped := 0
	for _, rule := range ap.Spec.Rules {
		r, found := convertRule(action, ap.Namespace, rule)
		l7 = append(l7, found...)
		if r == nil {
			dropped++
			continue
		}
		out.Rules = append(out.Rules, r)
	}
	var msgs []string
	if len(l7) > 0 {
		attrs := strings.Join(dedupe(l7), ", ")
		if action == securityapi.Action_ALLOW {
			m := fmt.Sprintf("node proxies cannot match %s; %d ALLOW rule(s) using them dropped (more restrictive; use a waypoint for L7 rules)", attrs, dropped)
			if len(out.Rules) == 0 {
				m += "; no rule is left, so this policy denies all traffic to the workloads it selects"
			}
			msgs = append(msgs, m)
		} else {
			m := fmt.Sprintf("node proxies cannot match %s; omitted from DENY rules (a match left with only L7 conditions never matches)", attrs)
			if neverMatches(out) {
				m += "; this DENY policy has no effect at node proxies"
			}
			msgs = append(msgs, m)
		}
	}
	return out, msgs
}

// neverMatches reports whether every rule has a clause made only of empty
// Matches (node proxies skip empty Matches), or there is no rule at all.
func neverMatches(a *securityapi.Authorization) bool {
	for _, r := range a.Rules {
		dead := false
		for _, c := range r.Clauses {
			empty := len(c.Matches) > 0
			for _, m := range c.Matches {
				if !proto.Equal(m, &securityapi.Match{}) {
					empty = false
				}
			}
			dead = dead || empty
		}
		if !dead {
			return false
		}
	}
	return true
}

// convertRule converts one rule. For ALLOW, any L7 attribute drops the rule
// (nil). For DENY, L7 attributes are omitted from their Match. Each
// non-empty from/to/when list becomes one Clause (AND between them); each
// entry one Match (OR within).
func convertRule(action securityapi.Action, ns string, rule *securityv1beta1.Rule) (*securityapi.Rule, []string) {
	var l7 []string
	var from, to, when []*securityapi.Match
	for _, f := range rule.From {
		s := f.GetSource()
		found := l7Source(s)
		l7 = append(l7, found...)
		if len(found) > 0 && action == securityapi.Action_ALLOW {
			return nil, l7
		}
		from = append(from, &securityapi.Match{
			Principals:         stringMatches(s.GetPrincipals()),
			NotPrincipals:      stringMatches(s.GetNotPrincipals()),
			Namespaces:         stringMatches(s.GetNamespaces()),
			NotNamespaces:      stringMatches(s.GetNotNamespaces()),
			SourceIps:          addresses(s.GetIpBlocks()),
			NotSourceIps:       addresses(s.GetNotIpBlocks()),
			ServiceAccounts:    serviceAccounts(ns, s.GetServiceAccounts()),
			NotServiceAccounts: serviceAccounts(ns, s.GetNotServiceAccounts()),
		})
	}
	for _, tt := range rule.To {
		o := tt.GetOperation()
		found := l7Operation(o)
		l7 = append(l7, found...)
		if len(found) > 0 && action == securityapi.Action_ALLOW {
			return nil, l7
		}
		to = append(to, &securityapi.Match{
			DestinationPorts:    ports(o.GetPorts()),
			NotDestinationPorts: ports(o.GetNotPorts()),
		})
	}
	for _, c := range rule.When {
		if !l4WhenKeys[c.GetKey()] {
			l7 = append(l7, "when."+c.GetKey())
			if action == securityapi.Action_ALLOW {
				return nil, l7
			}
			when = append(when, &securityapi.Match{})
			continue
		}
		m := &securityapi.Match{}
		switch c.GetKey() {
		case "source.ip":
			m.SourceIps, m.NotSourceIps = addresses(c.GetValues()), addresses(c.GetNotValues())
		case "source.namespace":
			m.Namespaces, m.NotNamespaces = stringMatches(c.GetValues()), stringMatches(c.GetNotValues())
		case "source.principal":
			m.Principals, m.NotPrincipals = stringMatches(c.GetValues()), stringMatches(c.GetNotValues())
		case "destination.ip":
			m.DestinationIps, m.NotDestinationIps = addresses(c.GetValues()), addresses(c.GetNotValues())
		case "destination.port":
			m.DestinationPorts, m.NotDestinationPorts = ports(c.GetValues()), ports(c.GetNotValues())
		}
		when = append(when, m)
	}
	r := &securityapi.Rule{}
	for _, ms := range [][]*securityapi.Match{from, to, when} {
		if len(ms) > 0 {
			r.Clauses = append(r.Clauses, &securityapi.Clause{Matches: ms})
		}
	}
	return r, l7
}

func l7Source(s *securityv1beta1.Source) []string {
	var out []string
	add := func(name string, v []string) {
		if len(v) > 0 {
			out = append(out, "from.source."+name)
		}
	}
	add("requestPrincipals", s.GetRequestPrincipals())
	add("notRequestPrincipals", s.GetNotRequestPrincipals())
	add("remoteIpBlocks", s.GetRemoteIpBlocks())
	add("notRemoteIpBlocks", s.GetNotRemoteIpBlocks())
	add("trustDomains", s.GetTrustDomains())
	add("notTrustDomains", s.GetNotTrustDomains())
	return out
}

func l7Operation(o *securityv1beta1.Operation) []string {
	var out []string
	add := func(name string, v []string) {
		if len(v) > 0 {
			out = append(out, "to.operation."+name)
		}
	}
	add("hosts", o.GetHosts())
	add("notHosts", o.GetNotHosts())
	add("methods", o.GetMethods())
	add("notMethods", o.GetNotMethods())
	add("paths", o.GetPaths())
	add("notPaths", o.GetNotPaths())
	return out
}

// stringMatches: "*" is presence, "*x" a suffix, "x*" a prefix, else exact.
func stringMatches(vs []string) []*securityapi.StringMatch {
	var out []*securityapi.StringMatch
	for _, v := range vs {
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

// addresses parses IPs and CIDRs; unparsable entries are skipped, as istiod
// does (its validation rejects them first).
func addresses(vs []string) []*securityapi.Address {
	var out []*securityapi.Address
	for _, v := range vs {
		if p, err := netip.ParsePrefix(v); err == nil {
			out = append(out, &securityapi.Address{Address: addrBytes(p.Addr()), Length: uint32(p.Bits())})
		} else if a, err := netip.ParseAddr(v); err == nil {
			out = append(out, &securityapi.Address{Address: addrBytes(a), Length: uint32(a.BitLen())})
		}
	}
	return out
}

func ports(vs []string) []uint32 {
	var out []uint32
	for _, v := range vs {
		if p, err := strconv.ParseUint(v, 10, 16); err == nil {
			out = append(out, uint32(p))
		}
	}
	return out
}

// serviceAccounts parses "ns/sa" or "sa" (policy namespace).
func serviceAccounts(ns string, vs []string) []*securityapi.ServiceAccountMatch {
	var out []*securityapi.ServiceAccountMatch
	for _, v := range vs {
		n, sa, ok := strings.Cut(v, "/")
		if !ok {
			n, sa = ns, v
		}
		out = append(out, &securityapi.ServiceAccountMatch{Namespace: n, ServiceAccount: sa})
	}
	return out
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

// policiesFor returns the WORKLOAD_SELECTOR policy keys selecting labels in ns.
func (t *translator) policiesFor(ns string, labels map[string]string) []string {
	var out []string
	for _, p := range t.selectorPolicies {
		if p.namespace == ns && subset(p.selector, labels) {
			out = append(out, p.key)
		}
	}
	return out
}
