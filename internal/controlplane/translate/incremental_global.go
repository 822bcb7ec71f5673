package translate

// The kinds translated as one global unit (namespaces, policies,
// PeerAuthentications, ServiceEntries, Gateways and their relatives): what
// changed among them, and which pods, Services and EndpointSlices such a
// change can reach (issue 29's per-kind incremental translation).

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
)

// globalChange names the first kind that changed and is translated only
// as a whole, re-translating everything; "" when none did.
func (tr *Translator) globalChange(objs *cluster.Objects) string {
	o := tr.objs
	switch {
	case changed(o.WorkloadEntries, objs.WorkloadEntries):
		return "WorkloadEntry changed"
	case changed(o.GatewayClasses, objs.GatewayClasses):
		return "GatewayClass changed"
	case tr.cfg.Network == "" && rootNetwork(o.Namespaces, tr.cfg.RootNamespace) != rootNetwork(objs.Namespaces, tr.cfg.RootNamespace):
		// The system namespace's network label is the default network
		// of every workload and VIP (clusterNetwork), not only its own.
		return "system namespace network changed"
	}
	return ""
}

// rootNetwork is the network label of the namespace named root in nss,
// which is sorted by name.
func rootNetwork(nss []*corev1.Namespace, root string) string {
	i, ok := slices.BinarySearchFunc(nss, root, func(n *corev1.Namespace, name string) int { return cmp.Compare(n.Name, name) })
	if !ok {
		return ""
	}
	return nss[i].Labels[LabelNetwork]
}

// globalDiff is what changed among the kinds the global unit translates
// that an Update handles without a full translation: the global unit is
// re-translated, and the pods, Services and EndpointSlices they can
// change (globalDirty).
type globalDiff struct {
	namespaces     []objChange[*corev1.Namespace]
	serviceEntries []objChange[*networkingv1.ServiceEntry]
	peerAuthns     []objChange[*securityv1.PeerAuthentication]
	gateways       []objChange[*gatewayv1.Gateway]
	// authzPolicies, requestAuthns, allocs: changed at all (what they
	// change is found by comparing the translations).
	authzPolicies, requestAuthns, allocs bool
	// authzPolicyNs: the namespaces of the AuthorizationPolicies that
	// changed, came or went.
	authzPolicyNs map[string]bool
	// anyPeerAuthn: the first PeerAuthentication appeared or the last went.
	anyPeerAuthn bool
}

func (tr *Translator) globalDiff(objs *cluster.Objects, allocs *autoalloc.Allocations) *globalDiff {
	o := tr.objs
	g := &globalDiff{
		namespaces:     diff(o.Namespaces, objs.Namespaces),
		serviceEntries: diff(o.ServiceEntries, objs.ServiceEntries),
		peerAuthns:     diff(o.PeerAuthentications, objs.PeerAuthentications),
		gateways:       diff(o.Gateways, objs.Gateways),
		requestAuthns:  changed(o.RequestAuthentications, objs.RequestAuthentications),
		allocs:         !allocs.ListEqual(tr.allocs),
		anyPeerAuthn:   (len(o.PeerAuthentications) == 0) != (len(objs.PeerAuthentications) == 0),
	}
	for _, c := range diff(o.AuthorizationPolicies, objs.AuthorizationPolicies) {
		if g.authzPolicyNs == nil {
			g.authzPolicyNs = map[string]bool{}
		}
		g.authzPolicyNs[c.either().Namespace] = true
		g.authzPolicies = true
	}
	if len(g.namespaces)+len(g.serviceEntries)+len(g.peerAuthns)+len(g.gateways) == 0 &&
		!g.authzPolicies && !g.requestAuthns && !g.allocs {
		return nil
	}
	return g
}

// onlyNamespacesAndPolicies: Namespaces, AuthorizationPolicies and
// PeerAuthentications are all that changed.
func (g *globalDiff) onlyNamespacesAndPolicies() bool {
	return len(g.serviceEntries)+len(g.gateways) == 0 && !g.requestAuthns && !g.allocs
}

// kinds names what changed, for Changes.Reason.
func (g *globalDiff) kinds() string {
	var k []string
	add := func(b bool, name string) {
		if b {
			k = append(k, name)
		}
	}
	add(len(g.namespaces) > 0, "Namespace")
	add(g.authzPolicies, "AuthorizationPolicy")
	add(len(g.peerAuthns) > 0, "PeerAuthentication")
	add(g.requestAuthns, "RequestAuthentication")
	add(len(g.serviceEntries) > 0, "ServiceEntry")
	add(g.allocs, "ServiceEntry allocations")
	add(len(g.gateways) > 0, "Gateway")
	return strings.Join(k, ", ")
}

// retranslateGlobal builds the translator for objs from the current one:
// it shares the pod, Service and EndpointSlice indexes (already updated to
// objs), rebuilds the rest (indexGlobal), and translates the global unit
// again. The old translator is left as it was, for globalDirty. When the
// AuthorizationPolicies did not change (samePolicies), their conversions
// cache, selector policies and per-namespace index are the old ones
// (they read nothing but the policies).
//
// Otherwise policyNs names the namespaces whose AuthorizationPolicies
// changed: the others' policiesByNs lists are the old ones.
func (tr *Translator) retranslateGlobal(objs *cluster.Objects, allocs *autoalloc.Allocations, samePolicies, sameAuthz bool, policyNs map[string]bool) (*translator, *unit) {
	old := tr.t
	t := newTranslator(tr.cfg, objs, allocs)
	t.idx = old.idx
	t.indexGlobal()
	tr.t = t
	if !allocs.ListEqual(tr.allocs) {
		tr.allocs = allocs.List()
	}
	tr.targetRefPolicies = false
	for _, ap := range objs.AuthorizationPolicies {
		if ap.Spec.TargetRef != nil || len(ap.Spec.TargetRefs) > 0 {
			tr.targetRefPolicies = true
		}
	}
	if samePolicies {
		t.apCache, t.samePolicies = tr.apCache, old
		if sameAuthz && !tr.targetRefPolicies && len(objs.RequestAuthentications) == 0 {
			t.sameAuthz = old
		}
		u := tr.unit(t.translateGlobal)
		t.apCache, t.samePolicies, t.sameAuthz = nil, nil, nil
		return t, u
	}
	t.apCache, t.apNext = tr.apCache, make(map[*securityv1.AuthorizationPolicy]convertedPolicy, len(objs.AuthorizationPolicies))
	t.prevPolicies, t.policyNs = old, policyNs
	u := tr.unit(t.translateGlobal)
	tr.apCache, t.apCache, t.apNext = t.apNext, nil, nil
	t.prevPolicies, t.policyNs = nil, nil
	return t, u
}

// translateGlobal translates the kinds that make up the global unit.
func (t *translator) translateGlobal() {
	t.translateWaypoints()
	t.translatePolicies()
	t.translateServiceEntries()
	t.translateExternalNames()
	t.translateWorkloadEntries()
	t.translateServiceEntryEndpoints()
}

// translatePolicies translates the AuthorizationPolicies,
// PeerAuthentications and RequestAuthentications, or, with sameAuthz,
// takes what that translator made of the same ones: they read nothing
// else that a change of the global unit can move (no targetRefs, which
// read waypoints and Services; no RequestAuthentication, whose status
// reads fetched keys), so the Authorizations map (never written after
// this), the PeerAuthentication index, the selector policies, statuses
// and warnings are the same.
func (t *translator) translatePolicies() {
	if o := t.sameAuthz; o != nil {
		t.authz, t.pa = o.authz, o.pa
		t.selectorPolicies, t.idx.policiesByNs = o.selectorPolicies, o.idx.policiesByNs
		t.policyStatuses, t.policyWarns = o.policyStatuses, o.policyWarns
		t.policies = append(t.policies, o.policyStatuses...)
		for _, w := range o.policyWarns {
			t.warnings[w] = true
		}
		return
	}
	outer, n := t.warnings, len(t.policies)
	t.warnings = map[string]bool{}
	t.translateAuthorizationPolicies()
	t.translatePeerAuthentications()
	t.translateRequestAuthentications()
	t.indexPolicies()
	t.policyStatuses = slices.Clone(t.policies[n:])
	for w := range t.warnings {
		t.policyWarns = append(t.policyWarns, w)
		outer[w] = true
	}
	t.warnings = outer
}

// globalDirty marks the pods, Services and EndpointSlices whose
// translation the change g can alter, comparing the translator before
// (old) and after (t); pods and Services are looked up in t's (shared)
// index. Where the exact dependency is hard to tell it marks more, never
// less:
//
//   - a Namespace: its pods, Services and EndpointSlices (its labels
//     decide enrollment, network, waypoint use and who may use a
//     waypoint, its annotations the canary weight);
//   - AuthorizationPolicy: the pods its selector matches, before and
//     after, in its namespace, or in every namespace for the root
//     namespace's (only WORKLOAD_SELECTOR policies are listed on
//     workloads; the others are only Authorizations);
//   - PeerAuthentication: one with a selector, the pods it matches before
//     and after in its namespace; one without, every pod of its namespace,
//     or every pod when it is the root namespace's or when the first
//     appears or the last goes (the static strict policy);
//   - ServiceEntry: the pods its workloadSelector matches before and after
//     (its hosts become their services); its own services and endpoints,
//     and the ExternalName aliases of its hosts, are the global unit's;
//   - Gateway: every pod and Service naming (use-waypoint or its canary,
//     by their own labels or their namespace's) a waypoint whose
//     translation changed, or labelled with a changed Gateway's name
//     (gateway-name: waypoint pods take its inbound binding, a waypoint's
//     Service gets no waypoint);
//   - RequestAuthentication and the ServiceEntry allocations: nothing
//     beyond the global unit (they only shape its output and statuses).
//
// It reports whether a waypoint's translation changed or a Gateway did.
func (tr *Translator) globalDirty(objs *cluster.Objects, old, t *translator, g *globalDiff, dirtyPods, dirtySvc, dirtySlices map[string]bool) bool {
	x := &t.idx
	root := t.cfg.RootNamespace
	allPods := false
	nsAll := map[string]bool{}                // every pod of the namespace
	nsSel := map[string][]map[string]string{} // pods matching one of the selectors
	sel := func(ns string, s map[string]string) {
		if ns == root {
			ns = "" // every namespace
		}
		nsSel[ns] = append(nsSel[ns], s)
	}
	for _, c := range g.namespaces {
		nsAll[c.either().Name] = true
	}
	if g.authzPolicies {
		// Only the namespaces of the policies that changed list other
		// selector policies (indexPolicies).
		for ns := range g.authzPolicyNs {
			if sameSelectorPolicies(old.idx.policiesByNs[ns], x.policiesByNs[ns]) {
				continue
			}
			before, after := policySelectors(old.idx.policiesByNs[ns]), policySelectors(x.policiesByNs[ns])
			for k := range keysOf(before, after) {
				b, inB := before[k]
				a, inA := after[k]
				if inB && inA && maps.Equal(a, b) {
					continue
				}
				if inB {
					sel(ns, b)
				}
				if inA {
					sel(ns, a)
				}
			}
		}
	}
	if g.anyPeerAuthn {
		allPods = true
	}
	for _, c := range g.peerAuthns {
		for _, p := range []*securityv1.PeerAuthentication{c.old, c.new} {
			switch {
			case p == nil:
			case p.Spec.Selector != nil:
				nsSel[p.Namespace] = append(nsSel[p.Namespace], p.Spec.Selector.GetMatchLabels())
			case p.Namespace == root:
				allPods = true
			default:
				nsAll[p.Namespace] = true
			}
		}
	}
	for _, c := range g.serviceEntries {
		for _, se := range []*networkingv1.ServiceEntry{c.old, c.new} {
			if se != nil && se.Spec.WorkloadSelector != nil {
				// selects: an empty workloadSelector selects nothing.
				if l := se.Spec.WorkloadSelector.GetLabels(); len(l) > 0 {
					nsSel[se.Namespace] = append(nsSel[se.Namespace], l)
				}
			}
		}
	}
	// Waypoints whose translation changed, and Gateways that changed.
	wps := map[string]bool{}
	for k := range keysOf(old.idx.waypoints, x.waypoints) {
		if !sameWaypoint(old.idx.waypoints[k], x.waypoints[k]) {
			wps[k] = true
		}
	}
	gws := maps.Clone(wps)
	for _, c := range g.gateways {
		gws[key(c.either())] = true
	}
	refers := func(l map[string]string, ns string) bool {
		for _, lk := range [][2]string{{LabelUseWaypoint, LabelUseWaypointNamespace}, {LabelUseWaypointCanary, LabelUseWaypointCanaryNamespace}} {
			if n := l[lk[0]]; n != "" {
				wns := l[lk[1]]
				if wns == "" {
					wns = ns
				}
				if wps[wns+"/"+n] {
					return true
				}
			}
		}
		return false
	}
	nsRefers := func(ns string) bool {
		return refers(old.nsLabels(ns), ns) || refers(t.nsLabels(ns), ns)
	}
	gwObject := func(l map[string]string, ns string) bool {
		gw, ok := l[LabelGatewayName]
		return ok && gws[ns+"/"+gw]
	}
	if len(gws) > 0 {
		for ns := range keysOf(old.idx.namespaces, x.namespaces) {
			if nsRefers(ns) {
				nsAll[ns] = true
			}
		}
	}

	matches := func(sels []map[string]string, l map[string]string) bool {
		for _, s := range sels {
			if subset(s, l) {
				return true
			}
		}
		return false
	}
	if allPods || len(nsSel[""]) > 0 || len(gws) > 0 {
		for k, p := range x.pods {
			if allPods || nsAll[p.Namespace] || matches(nsSel[""], p.Labels) || matches(nsSel[p.Namespace], p.Labels) ||
				len(gws) > 0 && (refers(p.Labels, p.Namespace) || gwObject(p.Labels, p.Namespace)) {
				dirtyPods[k] = true
			}
		}
	} else {
		for ns := range nsAll {
			for _, p := range x.podsByNs[ns] {
				dirtyPods[key(p)] = true
			}
		}
		for ns, sels := range nsSel {
			for _, p := range x.podsByNs[ns] {
				if matches(sels, p.Labels) {
					dirtyPods[key(p)] = true
				}
			}
		}
	}
	// Services and EndpointSlices read only their namespace (and, for a
	// Service, the waypoints and Gateways).
	svcNs := map[string]bool{}
	for _, c := range g.namespaces {
		svcNs[c.either().Name] = true
	}
	if len(gws) > 0 {
		for ns := range nsAll {
			if nsRefers(ns) {
				svcNs[ns] = true
			}
		}
	}
	if len(gws) > 0 {
		for k, s := range x.svcByName {
			if svcNs[s.Namespace] || refers(s.Labels, s.Namespace) || gwObject(s.Labels, s.Namespace) {
				dirtySvc[k] = true
			}
		}
	} else {
		// Only whole namespaces: their part of the sorted lists, not a
		// scan of every Service (5,000 at 50k pods, half of a namespace
		// change's own time before).
		for ns := range svcNs {
			for _, s := range nsRange(objs.Services, ns) {
				if k := key(s); x.svcByName[k] != nil {
					dirtySvc[k] = true
				}
			}
		}
	}
	if len(g.namespaces) > 0 {
		for ns := range svcNs {
			for _, es := range nsRange(objs.EndpointSlices, ns) {
				if k := key(es); tr.sliceObj[k] != nil {
					dirtySlices[k] = true
				}
			}
		}
	}
	return len(gws) > 0
}

// nsRange is the part of list, sorted by namespace and name
// (cluster.Objects.Sort), in namespace ns.
func nsRange[T object](list []T, ns string) []T {
	i, _ := slices.BinarySearchFunc(list, ns, func(o T, ns string) int { return cmp.Compare(o.GetNamespace(), ns) })
	j := i
	for j < len(list) && list[j].GetNamespace() == ns {
		j++
	}
	return list[i:j]
}

// sameSelectorPolicies: a and b list the same policies with the same
// selectors in the same order.
func sameSelectorPolicies(a, b []selectorPolicy) bool {
	return slices.EqualFunc(a, b, func(p, q selectorPolicy) bool { return p.key == q.key && maps.Equal(p.selector, q.selector) })
}

// policySelectors maps each selector policy's key to its selector.
func policySelectors(ps []selectorPolicy) map[string]map[string]string {
	m := make(map[string]map[string]string, len(ps))
	for _, p := range ps {
		m[p.key] = p.selector
	}
	return m
}

// keysOf is the union of the keys of a and b.
func keysOf[V any](a, b map[string]V) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// sameWaypoint: two translations of a waypoint (nil: none) that every
// object bound to it would translate alike.
func sameWaypoint(a, b *waypoint) bool {
	if a == nil || b == nil {
		return a == b
	}
	sel := func(w *waypoint) string {
		if w.allowed.selector == nil {
			return ""
		}
		return w.allowed.selector.String()
	}
	return a.key == b.key && a.forService == b.forService && a.forWorkload == b.forWorkload &&
		a.trafficType == b.trafficType && proto.Equal(a.addr, b.addr) && proto.Equal(a.binding, b.binding) &&
		a.allowed.own == b.allowed.own && a.allowed.from == b.allowed.from && a.allowed.bad == b.allowed.bad &&
		(a.allowed.selector == nil) == (b.allowed.selector == nil) && sel(a) == sel(b)
}
