package translate

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// VirtualService delegation, as Istio defines it (istio.io/api
// networking/v1alpha3 Delegate, and istiod's merge in
// pilot/pkg/model/virtualservice.go, read 2026-12-05):
//
// An http rule of a root VirtualService (one with hosts) may name, instead
// of destinations, a delegate: another VirtualService by name and
// namespace (default: the root's). The delegate has no hosts and no
// gateways, only http rules, and none of them delegates again (one level).
// Each of its rules becomes a rule of the root in its place, in order:
//
//   - matches: every match of the delegate rule must fall within a match of
//     the root rule (its uri, scheme, method and authority a narrower
//     exact or prefix, never a regex on either side; its headers, query
//     parameters and sourceLabels not contradicting the root's; the same
//     ignoreUriCase, port and sourceNamespace; gateways a subset), and is
//     merged with each root match it does not contradict, the root's
//     conditions filling what the delegate leaves unset. A delegate rule
//     with a match that fits no root match is dropped and the status says so.
//   - rewrite, directResponse, timeout, retries, fault, mirror(s), corsPolicy
//     and headers: the delegate's, else the root rule's.
//   - short host names resolve in the namespace of the object that wrote
//     them: a delegate's destinations in the delegate's namespace.
//
// Who may use a delegate is the delegate owner's choice: its exportTo (else
// meshConfig defaultVirtualServiceExportTo) must include the root's
// namespace. A VirtualService without hosts applies to no host by itself, so
// writing one takes no traffic; only a root that names it, by namespace and
// name, uses it. A VirtualService with hosts is never a delegate.
//
// Where Istio drops a root rule whose delegate is missing or not exported
// (its requests then fall through to later rules, which may route more
// widely), ztunnel-go keeps the rule and answers what it matches with 500,
// and the root's status names the reason: a withdrawn delegate never widens
// where requests go.

// delegateOf returns the delegate an http rule of root names, or why it
// cannot be used.
func (ir *istioRouting) delegateOf(root *networkingv1.VirtualService, d *networkingv1alpha3.Delegate) (*networkingv1.VirtualService, string) {
	ns := d.GetNamespace()
	if ns == "" {
		ns = root.Namespace
	}
	if d.GetName() == "" {
		return nil, "names no VirtualService"
	}
	if ir.vsByName == nil {
		ir.vsByName = make(map[string]*networkingv1.VirtualService, len(ir.t.objs.VirtualServices))
		for _, v := range ir.t.objs.VirtualServices {
			ir.vsByName[v.Namespace+"/"+v.Name] = v
		}
	}
	key := ns + "/" + d.GetName()
	dv := ir.vsByName[key]
	switch {
	case dv == nil:
		return nil, "VirtualService " + key + " does not exist"
	case len(dv.Spec.GetHosts()) > 0:
		return nil, "VirtualService " + key + " has hosts: it is a root, not a delegate (a delegate has no hosts)"
	case len(dv.Spec.GetGateways()) > 0:
		return nil, "delegate " + key + " names gateways; a delegate must not"
	case len(dv.Spec.GetTcp()) > 0 || len(dv.Spec.GetTls()) > 0:
		return nil, "delegate " + key + " has tcp or tls rules; a delegate has http rules only"
	}
	if e, _ := parseExportTo(dv.Spec.GetExportTo(), ir.t.cfg.DefaultVirtualServiceExportTo, dv.Namespace, "spec.exportTo"); !e.visibleTo(root.Namespace) {
		return nil, "delegate " + key + " is not exported to namespace " + root.Namespace + " (its exportTo, else meshConfig defaultVirtualServiceExportTo)"
	}
	return dv, ""
}

// resolvedHTTP returns a copy of h with its destination and mirror hosts
// resolved in namespace ns (Istio's short-name rule), so that a rule
// merged from a root and a delegate keeps each host in its writer's
// namespace.
func (ir *istioRouting) resolvedHTTP(h *networkingv1alpha3.HTTPRoute, ns string) *networkingv1alpha3.HTTPRoute {
	c := proto.Clone(h).(*networkingv1alpha3.HTTPRoute)
	for _, d := range c.GetRoute() {
		if d.GetDestination() != nil {
			d.Destination.Host = ir.t.resolveIstioHost(d.Destination.GetHost(), ns)
		}
	}
	if c.GetMirror() != nil {
		c.Mirror.Host = ir.t.resolveIstioHost(c.Mirror.GetHost(), ns)
	}
	for _, m := range c.GetMirrors() {
		if m.GetDestination() != nil {
			m.Destination.Host = ir.t.resolveIstioHost(m.Destination.GetHost(), ns)
		}
	}
	return c
}

// mergeDelegated merges root (an http rule with a delegate) with sub, one
// rule of its delegate, both already resolved (resolvedHTTP); sub is
// modified. ok is false when a match of sub fits no match of root.
func mergeDelegated(root, sub *networkingv1alpha3.HTTPRoute) (*networkingv1alpha3.HTTPRoute, bool) {
	matches, ok := mergeMatches(root.GetMatch(), sub.GetMatch())
	if !ok {
		return nil, false
	}
	sub.Match = matches
	switch {
	case sub.Name == "":
		sub.Name = root.Name
	case root.Name != "":
		sub.Name = root.Name + "-" + sub.Name
	}
	if sub.Rewrite == nil {
		sub.Rewrite = root.Rewrite
	}
	if sub.DirectResponse == nil {
		sub.DirectResponse = root.DirectResponse
	}
	if sub.Timeout == nil {
		sub.Timeout = root.Timeout
	}
	if sub.Retries == nil {
		sub.Retries = root.Retries
	}
	if sub.Fault == nil {
		sub.Fault = root.Fault
	}
	if sub.Mirror == nil {
		sub.Mirror = root.Mirror
	}
	if sub.MirrorPercent == nil { //nolint:staticcheck // deprecated, still read
		sub.MirrorPercent = root.MirrorPercent //nolint:staticcheck
	}
	if sub.MirrorPercentage == nil {
		sub.MirrorPercentage = root.MirrorPercentage
	}
	if sub.CorsPolicy == nil {
		sub.CorsPolicy = root.CorsPolicy
	}
	if sub.Mirrors == nil {
		sub.Mirrors = root.Mirrors
	}
	if sub.Headers == nil {
		sub.Headers = root.Headers
	}
	return sub, true
}

// mergeMatches merges the matches of a root rule and a delegate rule: no
// matches on one side takes the other's; else every delegate match is
// merged with each root match it does not contradict, and one that fits
// none makes ok false.
func mergeMatches(root, sub []*networkingv1alpha3.HTTPMatchRequest) ([]*networkingv1alpha3.HTTPMatchRequest, bool) {
	if len(root) == 0 {
		return sub, true
	}
	if len(sub) == 0 {
		out := make([]*networkingv1alpha3.HTTPMatchRequest, len(root))
		for i, m := range root {
			out[i] = proto.Clone(m).(*networkingv1alpha3.HTTPMatchRequest)
		}
		return out, true
	}
	var out []*networkingv1alpha3.HTTPMatchRequest
	for _, s := range sub {
		fits := false
		for _, r := range root {
			if matchesContradict(r, s) {
				continue
			}
			out = append(out, mergeMatch(r, s))
			fits = true
		}
		if !fits {
			return nil, false
		}
	}
	return out, len(out) > 0
}

// mergeMatch is the delegate's match with the root's conditions filling
// what it leaves unset (maps: the union, the delegate's value on a shared
// key, which matchesContradict allowed only when compatible).
func mergeMatch(r, s *networkingv1alpha3.HTTPMatchRequest) *networkingv1alpha3.HTTPMatchRequest {
	out := proto.Clone(s).(*networkingv1alpha3.HTTPMatchRequest)
	switch {
	case out.Name == "":
		out.Name = r.Name
	case r.Name != "":
		out.Name = r.Name + "-" + out.Name
	}
	if out.Uri == nil {
		out.Uri = r.Uri
	}
	if out.Scheme == nil {
		out.Scheme = r.Scheme
	}
	if out.Method == nil {
		out.Method = r.Method
	}
	if out.Authority == nil {
		out.Authority = r.Authority
	}
	union := func(a, b map[string]*networkingv1alpha3.StringMatch) map[string]*networkingv1alpha3.StringMatch {
		if len(a)+len(b) == 0 {
			return nil
		}
		m := maps.Clone(a)
		if m == nil {
			m = map[string]*networkingv1alpha3.StringMatch{}
		}
		maps.Copy(m, b)
		return m
	}
	out.Headers = union(r.Headers, s.Headers)
	out.WithoutHeaders = union(r.WithoutHeaders, s.WithoutHeaders)
	out.QueryParams = union(r.QueryParams, s.QueryParams)
	if out.Port == 0 {
		out.Port = r.Port
	}
	if len(r.SourceLabels)+len(s.SourceLabels) > 0 {
		l := maps.Clone(r.SourceLabels)
		if l == nil {
			l = map[string]string{}
		}
		maps.Copy(l, s.SourceLabels)
		out.SourceLabels = l
	}
	if out.SourceNamespace == "" {
		out.SourceNamespace = r.SourceNamespace
	}
	if len(out.Gateways) == 0 {
		out.Gateways = r.Gateways
	}
	if out.StatPrefix == "" {
		out.StatPrefix = r.StatPrefix
	}
	return out
}

// matchesContradict reports whether the delegate match s asks for what
// the root match r excludes, so that merging them would match requests
// the root rule does not (Istio's rules: see the comment at the top).
func matchesContradict(r, s *networkingv1alpha3.HTTPMatchRequest) bool {
	pairs := [][2]*networkingv1alpha3.StringMatch{{r.Uri, s.Uri}, {r.Scheme, s.Scheme}, {r.Method, s.Method}, {r.Authority, s.Authority}}
	for _, p := range pairs {
		if stringMatchContradicts(p[0], p[1]) {
			return true
		}
	}
	for _, m := range [][2]map[string]*networkingv1alpha3.StringMatch{{r.Headers, s.Headers}, {r.WithoutHeaders, s.WithoutHeaders}, {r.QueryParams, s.QueryParams}} {
		for k, v := range m[1] {
			if stringMatchContradicts(m[0][k], v) {
				return true
			}
		}
	}
	if r.IgnoreUriCase != s.IgnoreUriCase {
		return true
	}
	if r.Port != 0 && s.Port != 0 && r.Port != s.Port {
		return true
	}
	if r.SourceNamespace != "" && s.SourceNamespace != r.SourceNamespace {
		return true
	}
	for k, v := range s.SourceLabels {
		if rv, ok := r.SourceLabels[k]; ok && rv != v {
			return true
		}
	}
	if len(r.Gateways) > 0 && len(s.Gateways) > 0 {
		for _, g := range s.Gateways {
			if !slices.Contains(r.Gateways, g) {
				return true
			}
		}
	}
	return false
}

// stringMatchContradicts: unset on either side never contradicts; a regex
// on either side always does (Istio cannot prove one regex within
// another); an exact root needs the same exact value; a prefix root needs
// an exact or prefix value that starts with it.
func stringMatchContradicts(r, s *networkingv1alpha3.StringMatch) bool {
	if r == nil || s == nil {
		return false
	}
	if r.GetRegex() != "" || s.GetRegex() != "" {
		return true
	}
	if e := r.GetExact(); e != "" {
		return s.GetExact() != e
	}
	if p := r.GetPrefix(); p != "" {
		switch {
		case s.GetPrefix() != "":
			return !strings.HasPrefix(s.GetPrefix(), p)
		case s.GetExact() != "":
			return !strings.HasPrefix(s.GetExact(), p)
		}
	}
	return true
}

// delegated is one rule a delegating http rule turns into.
type delegated struct {
	rule *networkingv1alpha3.HTTPRoute
	ns   string // where its short hosts were written (already resolved)
	path string // for the status
	// fail: the rule answers what it matches with 500 (the delegate cannot
	// be used); rule holds only its matches.
	fail bool
}

// convertDelegating expands http rule h (at path) of root, which
// delegates: into the delegate's rules merged with it, or into one rule
// with h's matches that answers 500 when the delegate cannot be used. wp
// and svcKey name where the root is applied, for the delegate's status.
func (ir *istioRouting) convertDelegating(path string, root *networkingv1.VirtualService, h *networkingv1alpha3.HTTPRoute, wp, svcKey string, bad *problems, st *istioStatus) []delegated {
	failed := func(why string) []delegated {
		bad.addf(path+".delegate", "%s; requests this rule matches answer 500", why)
		return []delegated{{rule: &networkingv1alpha3.HTTPRoute{Match: h.GetMatch()}, ns: root.Namespace, path: path, fail: true}}
	}
	if len(h.GetRoute()) > 0 || h.GetRedirect() != nil {
		return failed("a rule with a delegate must not also have route or redirect")
	}
	dv, why := ir.delegateOf(root, h.GetDelegate())
	if why != "" {
		return failed(why)
	}
	dst := ir.vs[dv.Namespace+"/"+dv.Name]
	dst.attach(wp, svcKey)
	dst.addNote("delegate of VirtualService " + root.Namespace + "/" + root.Name)
	rootRule := ir.resolvedHTTP(h, root.Namespace)
	rootRule.Delegate = nil
	var out []delegated
	for j, sub := range dv.Spec.GetHttp() {
		subPath := fmt.Sprintf("%s.delegate(%s/%s).http[%d]", path, dv.Namespace, dv.Name, j)
		if sub.GetDelegate() != nil {
			bad.addf(subPath+".delegate", "a delegate's rule cannot delegate again (one level only); requests it matches answer 500")
			dst.addInvalid(fieldAt("spec.http", j) + ".delegate: a delegate's rule cannot delegate again (one level only)")
			if m, ok := mergeMatches(rootRule.GetMatch(), sub.GetMatch()); ok {
				out = append(out, delegated{rule: &networkingv1alpha3.HTTPRoute{Match: m}, ns: dv.Namespace, path: subPath, fail: true})
			}
			continue
		}
		merged, ok := mergeDelegated(rootRule, ir.resolvedHTTP(sub, dv.Namespace))
		if !ok {
			note := subPath + ": its matches do not fall within the root rule's; the rule is not applied (as Istio drops it)"
			st.addNote(note)
			dst.addNote(note)
			continue
		}
		out = append(out, delegated{rule: merged, ns: dv.Namespace, path: subPath})
	}
	return out
}

// clientsWithLabels returns the uids of the workloads (pods and
// WorkloadEntries, in any namespace) whose labels sel selects, sorted.
func (ir *istioRouting) clientsWithLabels(sel map[string]string) []string {
	key := labelsKey(sel)
	if uids, ok := ir.clients[key]; ok {
		return uids
	}
	if ir.clients == nil {
		ir.clients = map[string][]string{}
	}
	selector := labels.SelectorFromSet(sel)
	uids := []string{}
	for _, a := range ir.res.Addresses.All() {
		if w := a.GetWorkload(); w != nil {
			if l, ok := ir.workloadLabels(w); ok && selector.Matches(labels.Set(l)) {
				uids = append(uids, w.GetUid())
			}
		}
	}
	slices.Sort(uids)
	ir.clients[key] = uids
	return uids
}

func labelsKey(sel map[string]string) string {
	var b strings.Builder
	for _, k := range sortedKeys(sel) {
		b.WriteString(k + "=" + sel[k] + "\x00")
	}
	return b.String()
}

// anySourceLabels reports whether some VirtualService matches clients by
// their labels (its waypoint configs then list workloads).
func anySourceLabels(vss []*networkingv1.VirtualService) bool {
	for _, v := range vss {
		for _, h := range v.Spec.GetHttp() {
			for _, m := range h.GetMatch() {
				if len(m.GetSourceLabels()) > 0 {
					return true
				}
			}
		}
	}
	return false
}
