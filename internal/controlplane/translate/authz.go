package translate

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
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

// AnnotationDryRun marks an AuthorizationPolicy as dry-run: node proxies
// evaluate and log it but never enforce it (Istio's annotation).
const AnnotationDryRun = "istio.io/dry-run"

// NotEnforcedByWaypoint is the status of a targetRef policy: ztunnel-go has
// no waypoint of its own that enforces policies.
const NotEnforcedByWaypoint = "not enforced: no waypoint enforces policies in this mesh"

func (t *translator) translateAuthorizationPolicies() {
	o := t.objs
	t.policies = slices.Grow(t.policies, len(o.AuthorizationPolicies)+len(o.PeerAuthentications)+len(o.RequestAuthentications))
	var targets *targetIndex
	for _, ap := range t.objs.AuthorizationPolicies {
		key := ap.Namespace + "/" + ap.Name
		st := PolicyStatus{Kind: kindAP, Name: key}
		if refs := targetRefs(ap); len(refs) > 0 {
			if targets == nil {
				targets = t.newTargetIndex()
			}
			st.Message = t.attachToWaypoints(ap, refs, targets)
			// The values are checked even when no waypoint takes the
			// policy, so its status (and the webhook) name them now.
			if _, bad := convertWaypointPolicy(ap); len(bad) > 0 {
				st.Invalid = bad
				st.Message += "; values that cannot be enforced fail closed: " + strings.Join(bad, "; ")
			}
			t.warnf(kindAP, ap.Namespace, ap.Name, "%s", st.Message)
			t.policies = append(t.policies, st)
			continue
		}
		if ap.Spec.Action == securityv1beta1.AuthorizationPolicy_CUSTOM {
			st.Message = "action CUSTOM is not supported by node proxies; not sent"
			t.warnf(kindAP, ap.Namespace, ap.Name, "%s", st.Message)
			t.policies = append(t.policies, st)
			continue
		}
		out, msgs, bad := t.convertCached(ap)
		if len(msgs) > 0 {
			t.warnf(kindAP, ap.Namespace, ap.Name, "%s", strings.Join(msgs, "; "))
		}
		st.Sent = true
		st.DryRun = out.DryRun
		st.Invalid = bad
		st.Message = strings.Join(msgs, "; ")
		t.policies = append(t.policies, st)
		t.authz[key] = out
		if out.Scope == securityapi.Scope_WORKLOAD_SELECTOR && t.samePolicies == nil {
			t.selectorPolicies = append(t.selectorPolicies, selectorPolicy{
				namespace: ap.Namespace, key: key, selector: ap.Spec.Selector.GetMatchLabels(),
			})
		}
	}
	if t.samePolicies != nil {
		// The same policies select the same workloads (read only).
		t.selectorPolicies = t.samePolicies.selectorPolicies
	}
}

// convertedPolicy is one convertAuthorizationPolicy result.
type convertedPolicy struct {
	out       *securityapi.Authorization
	msgs, bad []string
}

// convertCached is convertAuthorizationPolicy through the Translator's
// cache (apCache, by object: a changed policy is a new object), so that a
// re-translation of the global unit converts only the policies that
// changed and keeps the same Authorization for the others (Apply pushes
// only the Authorizations whose pointer changed).
func (t *translator) convertCached(ap *securityv1.AuthorizationPolicy) (*securityapi.Authorization, []string, []string) {
	c, ok := t.apCache[ap]
	if !ok {
		c.out, c.msgs, c.bad = convertAuthorizationPolicy(t.cfg.RootNamespace, ap)
	}
	if t.apNext != nil {
		t.apNext[ap] = c
	}
	return c.out, c.msgs, c.bad
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

func (r *targetRef) String() string {
	g := r.group
	if g == "" {
		g = "core"
	}
	return g + "/" + r.kind + " " + r.name
}

// targetIndex is what a targetRef may name, built once per translation
// (only when some policy has targetRefs).
type targetIndex struct {
	services, serviceEntries, waypoints map[string]bool // "ns/name"
}

func (t *translator) newTargetIndex() *targetIndex {
	x := &targetIndex{services: map[string]bool{}, serviceEntries: map[string]bool{}, waypoints: map[string]bool{}}
	for _, s := range t.objs.Services {
		x.services[s.Namespace+"/"+s.Name] = true
	}
	for _, se := range t.objs.ServiceEntries {
		x.serviceEntries[se.Namespace+"/"+se.Name] = true
	}
	for _, gw := range t.objs.Gateways {
		if string(gw.Spec.GatewayClassName) == WaypointClass {
			x.waypoints[gw.Namespace+"/"+gw.Name] = true
		}
	}
	return x
}

// attachToWaypoints records ap on the waypoints it targets (Istio 1.25
// baseline): a Gateway of class istio-waypoint in the policy's namespace, or
// GatewayClass istio-waypoint from the root namespace (every waypoint). It
// returns the policy's status message: such policies are for waypoints, and
// ztunnel-go has none that enforces them, so they are never "enforced";
// each targetRef that names nothing is listed.
func (t *translator) attachToWaypoints(ap *securityv1.AuthorizationPolicy, refs []*targetRef, x *targetIndex) string {
	key := ap.Namespace + "/" + ap.Name
	attached := map[string]bool{}
	var nothing []string
	for _, r := range refs {
		ns := ap.Namespace
		if r.namespace != "" && r.namespace != ap.Namespace {
			nothing = append(nothing, r.String()+" (targetRefs cannot leave the policy's namespace)")
			continue
		}
		found := false
		switch {
		case r.group == "gateway.networking.k8s.io" && r.kind == "Gateway":
			if x.waypoints[ns+"/"+r.name] {
				attached[ns+"/"+r.name], found = true, true
			}
		case r.group == "gateway.networking.k8s.io" && r.kind == "GatewayClass":
			if r.name == WaypointClass && ap.Namespace != t.cfg.RootNamespace {
				nothing = append(nothing, r.String()+" (only from the root namespace "+t.cfg.RootNamespace+")")
				continue
			}
			if r.name == WaypointClass {
				for gw := range x.waypoints {
					attached[gw] = true
				}
				found = len(x.waypoints) > 0
			}
		case r.group == "" && r.kind == "Service":
			found = x.services[ns+"/"+r.name]
		case r.group == "networking.istio.io" && r.kind == "ServiceEntry":
			found = x.serviceEntries[ns+"/"+r.name]
		}
		if !found {
			nothing = append(nothing, r.String())
		}
	}
	for gw := range attached {
		t.wpPols[gw] = append(t.wpPols[gw], key)
		sort.Strings(t.wpPols[gw])
	}
	msg := NotEnforcedByWaypoint + " (targetRefs make it a waypoint policy; node proxies never get it)"
	if len(nothing) > 0 {
		msg += "; targetRef attaches to nothing: " + strings.Join(nothing, ", ")
	}
	return msg
}

// convertAuthorizationPolicy converts a policy without targetRefs (§5.4,
// §5.5). The messages describe dropped or omitted parts; bad lists the
// values that cannot be enforced ("field: why"). What cannot be enforced
// fails closed, as Istio does: an ALLOW rule with a bad value is dropped
// (allows less), a DENY rule with a bad value becomes a rule that matches
// every connection (denies everything the policy selects), and an action
// node proxies do not know denies everything too. AUDIT goes out as a
// dry-run DENY marked with securityapi.AuditExtension (logged, never
// enforced).
func convertAuthorizationPolicy(rootNs string, ap *securityv1.AuthorizationPolicy) (*securityapi.Authorization, []string, []string) {
	scope := securityapi.Scope_WORKLOAD_SELECTOR
	if ap.Spec.Selector == nil {
		scope = securityapi.Scope_NAMESPACE
		if ap.Namespace == rootNs {
			scope = securityapi.Scope_GLOBAL
		}
	}
	var bad problems
	var msgs []string
	out := &securityapi.Authorization{Name: ap.Name, Namespace: ap.Namespace, Scope: scope}
	if v, ok := ap.Annotations[AnnotationDryRun]; ok {
		dry, err := strconv.ParseBool(v)
		if err != nil {
			bad.addf("metadata.annotations["+AnnotationDryRun+"]", "%q is not true or false; the policy is enforced", v)
		}
		out.DryRun = dry
	}
	action := securityapi.Action_ALLOW
	switch ap.Spec.Action {
	case securityv1beta1.AuthorizationPolicy_ALLOW:
	case securityv1beta1.AuthorizationPolicy_DENY:
		action = securityapi.Action_DENY
	case securityv1beta1.AuthorizationPolicy_AUDIT:
		action = securityapi.Action_DENY
		out.DryRun = true
		out.Extensions = []*securityapi.Extension{{Name: securityapi.AuditExtension}}
		msgs = append(msgs, "AUDIT: sent as a dry-run policy; node proxies log its matches and never deny")
	default:
		bad.addf("spec.action", "unknown value %d", int32(ap.Spec.Action))
		out.Action = securityapi.Action_DENY
		out.Rules = []*securityapi.Rule{{}}
		msgs = append(msgs, "unknown action: sent as a DENY of every connection to the workloads it selects (fail closed)")
		return out, msgs, bad
	}
	out.Action = action
	var l7 []string
	droppedL7, droppedBad := 0, 0
	var denyAll []string
	for ri, rule := range ap.Spec.Rules {
		before := len(bad)
		r, found := convertRule(action, ap.Namespace, fieldAt("spec.rules", ri), rule, &bad)
		l7 = append(l7, found...)
		switch {
		case len(bad) > before && action == securityapi.Action_ALLOW:
			droppedBad++
		case len(bad) > before:
			out.Rules = append(out.Rules, &securityapi.Rule{})
			denyAll = append(denyAll, fieldAt("spec.rules", ri))
		case r == nil:
			droppedL7++
		default:
			out.Rules = append(out.Rules, r)
		}
	}
	if len(l7) > 0 {
		attrs := strings.Join(dedupe(l7), ", ")
		if action == securityapi.Action_ALLOW {
			msgs = append(msgs, fmt.Sprintf("node proxies cannot match %s; %d ALLOW rule(s) using them dropped (more restrictive; use a waypoint for L7 rules)", attrs, droppedL7))
		} else {
			msgs = append(msgs, fmt.Sprintf("node proxies cannot match %s; DENY rules are enforced without them, so they match more connections (fail closed: more restrictive than written, as istiod does; use a waypoint for L7 rules)", attrs))
		}
	}
	if len(bad) > 0 {
		msgs = append(msgs, "invalid: "+strings.Join(bad, "; "))
	}
	if droppedBad > 0 {
		msgs = append(msgs, fmt.Sprintf("%d ALLOW rule(s) with invalid values dropped (fail closed: allows less)", droppedBad))
	}
	if len(denyAll) > 0 {
		msgs = append(msgs, fmt.Sprintf("DENY rule(s) %s with invalid values match every connection (fail closed: denies all the policy selects)", strings.Join(denyAll, ", ")))
	}
	switch {
	case action == securityapi.Action_ALLOW && len(out.Rules) == 0 && droppedL7+droppedBad > 0:
		msgs = append(msgs, "no rule is left, so this policy denies all traffic to the workloads it selects")
	case action == securityapi.Action_DENY && len(l7) > 0 && matchesEverything(out):
		msgs = append(msgs, "a DENY rule left without conditions denies all traffic to the workloads it selects")
	}
	return out, msgs, bad
}

// matchesEverything reports whether some rule has no clause left.
func matchesEverything(a *securityapi.Authorization) bool {
	for _, r := range a.Rules {
		if len(r.Clauses) == 0 {
			return true
		}
	}
	return false
}

// convertRule converts one rule at path, adding every value it cannot
// enforce to bad (the caller decides what an invalid rule becomes). For
// ALLOW, any L7 attribute drops the rule (nil). For DENY, the rule is
// enforced without its L7 attributes, as istiod sends it to ztunnel: an
// entry left with only L7 attributes matches every connection, so its
// from/to list and an L7 `when` impose nothing and the rule matches more
// (fail closed). Each remaining from/to/when list becomes one Clause (AND
// between them); each entry one Match (OR within).
func convertRule(action securityapi.Action, ns, path string, rule *securityv1beta1.Rule, bad *problems) (*securityapi.Rule, []string) {
	var l7 []string
	var from, to, when []*securityapi.Match
	for i, f := range rule.From {
		s := f.GetSource()
		p := fieldAt(path+".from", i) + ".source."
		l7 = append(l7, l7Source(s)...)
		from = append(from, &securityapi.Match{
			Principals:         stringMatches(p+"principals", s.GetPrincipals(), true, bad),
			NotPrincipals:      stringMatches(p+"notPrincipals", s.GetNotPrincipals(), true, bad),
			Namespaces:         stringMatches(p+"namespaces", s.GetNamespaces(), false, bad),
			NotNamespaces:      stringMatches(p+"notNamespaces", s.GetNotNamespaces(), false, bad),
			SourceIps:          addresses(p+"ipBlocks", s.GetIpBlocks(), bad),
			NotSourceIps:       addresses(p+"notIpBlocks", s.GetNotIpBlocks(), bad),
			ServiceAccounts:    serviceAccounts(p+"serviceAccounts", ns, s.GetServiceAccounts(), bad),
			NotServiceAccounts: serviceAccounts(p+"notServiceAccounts", ns, s.GetNotServiceAccounts(), bad),
		})
	}
	for i, tt := range rule.To {
		o := tt.GetOperation()
		p := fieldAt(path+".to", i) + ".operation."
		l7 = append(l7, l7Operation(o)...)
		to = append(to, &securityapi.Match{
			DestinationPorts:    ports(p+"ports", o.GetPorts(), bad),
			NotDestinationPorts: ports(p+"notPorts", o.GetNotPorts(), bad),
		})
	}
	for i, c := range rule.When {
		p := fieldAt(path+".when", i)
		key := c.GetKey()
		l4, isL7 := whenKind(key)
		if len(c.GetValues()) == 0 && len(c.GetNotValues()) == 0 {
			bad.addf(p, "condition on %q has neither values nor notValues", key)
		}
		if !l4 {
			if isL7 {
				l7 = append(l7, "when."+key)
			} else {
				bad.addf(p+".key", "%q is not an attribute Istio knows", key)
			}
			when = append(when, &securityapi.Match{})
			continue
		}
		vs, nvs := p+".values", p+".notValues"
		m := &securityapi.Match{}
		switch key {
		case "source.ip":
			m.SourceIps, m.NotSourceIps = addresses(vs, c.GetValues(), bad), addresses(nvs, c.GetNotValues(), bad)
		case "source.namespace":
			m.Namespaces, m.NotNamespaces = stringMatches(vs, c.GetValues(), false, bad), stringMatches(nvs, c.GetNotValues(), false, bad)
		case "source.principal":
			m.Principals, m.NotPrincipals = stringMatches(vs, c.GetValues(), true, bad), stringMatches(nvs, c.GetNotValues(), true, bad)
		case "source.serviceAccount":
			m.ServiceAccounts, m.NotServiceAccounts = serviceAccounts(vs, ns, c.GetValues(), bad), serviceAccounts(nvs, ns, c.GetNotValues(), bad)
		case "destination.ip":
			m.DestinationIps, m.NotDestinationIps = addresses(vs, c.GetValues(), bad), addresses(nvs, c.GetNotValues(), bad)
		case "destination.port":
			m.DestinationPorts, m.NotDestinationPorts = ports(vs, c.GetValues(), bad), ports(nvs, c.GetNotValues(), bad)
		}
		when = append(when, m)
	}
	if len(l7) > 0 && action == securityapi.Action_ALLOW {
		return nil, l7
	}
	r := &securityapi.Rule{}
	for _, ms := range [][]*securityapi.Match{from, to} {
		if len(ms) > 0 && !slices.ContainsFunc(ms, emptyMatch) {
			r.Clauses = append(r.Clauses, &securityapi.Clause{Matches: ms})
		}
	}
	for _, m := range when {
		if !emptyMatch(m) {
			r.Clauses = append(r.Clauses, &securityapi.Clause{Matches: []*securityapi.Match{m}})
		}
	}
	return r, l7
}

// emptyMatch: a Match with no condition left (only L7 attributes, or none):
// it matches every connection, but node proxies skip empty Matches, so the
// clause holding it is omitted instead.
func emptyMatch(m *securityapi.Match) bool { return proto.Equal(m, &securityapi.Match{}) }

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

// policiesFor returns the WORKLOAD_SELECTOR policy keys selecting labels
// of a workload in ns: the policies of ns and, as istiod attaches them
// (buildWorkloadPolicies), those of the root namespace, whose selector
// policies select matching workloads in every namespace.
func (t *translator) policiesFor(ns string, labels map[string]string) []string {
	var out []string
	for _, p := range t.selectorPolicies {
		if (p.namespace == ns || p.namespace == t.cfg.RootNamespace) && subset(p.selector, labels) {
			out = append(out, p.key)
		}
	}
	return out
}

// ValidateAuthorizationPolicy returns the values of ap that cannot be
// enforced, each "<field path>: <why>", for an admission webhook to reject.
// It runs the conversion translation runs, so it returns exactly what
// PolicyStatus.Invalid reports after translation: for a policy without
// targetRefs the node proxies' conversion, for one with targetRefs the
// waypoints' (L7 fields included; CUSTOM, which no waypoint of ours
// enforces, is refused). A node-proxy CUSTOM policy is not sent (its status
// says so) and is not invalid.
func ValidateAuthorizationPolicy(rootNamespace string, ap *securityv1.AuthorizationPolicy) []string {
	if rootNamespace == "" {
		rootNamespace = DefaultRootNamespace
	}
	if len(targetRefs(ap)) > 0 {
		_, bad := convertWaypointPolicy(ap)
		return bad
	}
	if ap.Spec.Action == securityv1beta1.AuthorizationPolicy_CUSTOM {
		return nil
	}
	_, _, bad := convertAuthorizationPolicy(rootNamespace, ap)
	return bad
}
