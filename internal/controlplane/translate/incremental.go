package translate

import (
	"cmp"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/xds/resmap"
)

// Translator translates successive object sets of one cluster and redoes
// only what a change touches. Its output for a set never depends on the
// sets before it: Update(objs) equals Translate(objs) (a test checks this on
// random change sequences), so translation stays a pure function of its
// input and the golden tests cover both paths.
//
// How: every output resource belongs to one unit, the source object it was
// made from: a Pod (its workload), a Service (its service), an
// EndpointSlice (workloads of endpoints that are not pods), or the "global"
// unit (waypoints, policies, PeerAuthentication, ServiceEntries, aliases,
// WorkloadEntries). Pods, Services and EndpointSlices are the kinds that
// churn; a change to one of them re-translates its unit plus the units that
// read it, found through the indexes (Service selector → pods, Service →
// its slices, slice → the pods it names, pod → the slices naming it). A
// pod change re-translates that pod's workload and nothing else: a Service
// resource lists no endpoints, so no service changes (and slices naming
// the pod are redone only when the pod appears or disappears). A Node
// change re-translates the pods on that node, and only when the locality
// its labels give changed. A change of a kind the global unit translates
// (Namespace, AuthorizationPolicy, PeerAuthentication,
// RequestAuthentication, ServiceEntry and its allocations, Gateway)
// re-translates the global unit and the pods, Services and EndpointSlices
// it can reach (globalDirty says which, per kind). A WorkloadEntry or
// GatewayClass change, an ExternalName Service, or a Service whose
// hostname a ServiceEntry or alias also uses, re-translates everything:
// those are rare and a full translation is fast (indexed, O(objects)).
//
// A Translator is not safe for concurrent use; the Results it returns are
// immutable and may be read from any goroutine.
type Translator struct {
	cfg Config

	t      *translator // indexes and global results of the current set; nil before the first Update
	objs   *cluster.Objects
	allocs []autoalloc.Allocation
	// targetRefPolicies: some AuthorizationPolicy has targetRef(s), whose
	// status depends on which Services exist.
	targetRefPolicies bool
	// apCache: the AuthorizationPolicy conversions of the current set
	// (translator.convertCached).
	apCache map[*securityv1.AuthorizationPolicy]convertedPolicy

	global   *unit
	services map[string]*unit // ns/name
	pods     map[string]*unit
	slices   map[string]*unit
	sliceObj map[string]*discoveryv1.EndpointSlice

	addrs     *resmap.Map[*workloadapi.Address]
	bound     *resmap.Map[*workloadapi.Address] // the addrs bound to a waypoint (Result.bound)
	warnCount map[string]int
	warnings  []string
	res       *Result

	scratchA map[string]*workloadapi.Address
	scratchW map[string]bool
	// parallelMin is the pod count from which a full translation uses
	// every CPU (parallelPodsMin; tests lower it).
	parallelMin int
}

// unit is the output of one source object.
type unit struct {
	keys  []string
	addrs []*workloadapi.Address
	warns []string
}

// Changes says what one Update did.
type Changes struct {
	// Full is true when everything was re-translated; Reason says why. The
	// resources are then Result.Addresses as a whole (Addresses and
	// Removed are empty).
	Full   bool
	Reason string
	// Addresses holds the resources re-translated (changed or not), by
	// name; Removed the names that are gone.
	Addresses map[string]*workloadapi.Address
	Removed   []string
	// Pods, Services and EndpointSlices count the objects of each kind
	// translated by this Update (all of them when Full).
	Pods, Services, EndpointSlices int
	// Nodes counts the Nodes whose locality changed (not when Full): the
	// pods on them are re-translated.
	Nodes int
	// PodChanges lists the pods that changed (Old nil: added; New nil:
	// removed), only when not Full.
	PodChanges []PodChange
	// Global is true when a kind of the global unit changed (Reason names
	// them) and it was translated again, not when Full: Authorizations and
	// Policies may have changed, and waypoint configs may read it.
	Global bool
	// Routes is true when an HTTPRoute, GRPCRoute, ReferenceGrant,
	// VirtualService, DestinationRule or Telemetry changed, or a pod while DestinationRules exist (their
	// subsets list workloads) or a VirtualService matches sourceLabels (they
	// list client workloads), not when Full. Routes are not translated
	// into addresses; only waypoint configs (WaypointConfigs) read them.
	Routes bool
}

// PodChange is one pod's change between two sets.
type PodChange struct{ Old, New *corev1.Pod }

// NewTranslator returns a Translator for cfg (defaults as in Translate).
func NewTranslator(cfg Config) *Translator {
	return &Translator{
		cfg: cfg.withDefaults(), scratchA: map[string]*workloadapi.Address{}, scratchW: map[string]bool{},
		parallelMin: parallelPodsMin,
	}
}

// Result returns the latest translation (nil before the first Update).
func (tr *Translator) Result() *Result { return tr.res }

// Update translates objs, which must be sorted (cluster.Objects.Sort, as
// every Source publishes them) and are only read. allocs are the
// ServiceEntry auto-allocations (nil: none).
func (tr *Translator) Update(objs *cluster.Objects, allocs *autoalloc.Allocations) (*Result, *Changes) {
	if objs == nil {
		objs = &cluster.Objects{}
	}
	if tr.t == nil {
		return tr.full(objs, allocs, "first translation")
	}
	if reason := tr.globalChange(objs); reason != "" {
		return tr.full(objs, allocs, reason)
	}
	g := tr.globalDiff(objs, allocs)
	svcCh := diff(tr.objs.Services, objs.Services)
	for _, c := range svcCh {
		if reason := tr.serviceNeedsFull(c); reason != "" {
			return tr.full(objs, allocs, reason)
		}
	}
	sliceCh := diff(tr.objs.EndpointSlices, objs.EndpointSlices)
	podCh := diff(tr.objs.Pods, objs.Pods)
	nodeCh := diff(tr.objs.Nodes, objs.Nodes)
	if reason := tr.ownershipChange(svcCh, podCh, nodeCh); reason != "" {
		return tr.full(objs, allocs, reason)
	}
	routesCh := changed(tr.objs.HTTPRoutes, objs.HTTPRoutes) || changed(tr.objs.GRPCRoutes, objs.GRPCRoutes) ||
		changed(tr.objs.VirtualServices, objs.VirtualServices) || changed(tr.objs.DestinationRules, objs.DestinationRules) ||
		// A ReferenceGrant decides whether a route's backendRef resolves.
		changed(tr.objs.ReferenceGrants, objs.ReferenceGrants) ||
		// Telemetry objects only shape waypoint configs.
		changed(tr.objs.Telemetries, objs.Telemetries) ||
		// A Secret holds the certificates of a DestinationRule's tls.
		changed(tr.objs.Secrets, objs.Secrets) && len(objs.DestinationRules) > 0 ||
		// DestinationRule subsets name workloads by their labels: a pod
		// change can change a subset's members.
		len(podCh) > 0 && len(objs.DestinationRules) > 0 ||
		// So do VirtualService sourceLabels: they list client workloads.
		len(podCh) > 0 && anySourceLabels(objs.VirtualServices)

	t, x := tr.t, &tr.t.idx
	t.objs, tr.objs = objs, objs
	dirtySvc, dirtyPods, dirtySlices := map[string]bool{}, map[string]bool{}, map[string]bool{}
	markSlicePods := func(es *discoveryv1.EndpointSlice) {
		for _, p := range slicePods(es) {
			if _, ok := x.pods[es.Namespace+"/"+p]; ok {
				dirtyPods[es.Namespace+"/"+p] = true
			}
		}
	}
	// Index first, then decide what to redo against the new indexes.
	for _, c := range svcCh {
		if c.old != nil {
			x.removeService(c.old, t.serviceHostname(c.old))
		}
		if c.new != nil {
			x.addService(c.new, t.serviceHostname(c.new))
		}
	}
	for _, c := range sliceCh {
		if c.old != nil {
			x.removeSlice(c.old)
			delete(tr.sliceObj, key(c.old))
		}
		if c.new != nil {
			x.addSlice(c.new)
			tr.sliceObj[key(c.new)] = c.new
		}
		dirtySlices[key(c.either())] = true
	}
	for _, c := range podCh {
		if c.old != nil {
			x.removePod(c.old)
		}
		if c.new != nil {
			x.addPod(c.new)
		}
	}
	for _, c := range svcCh {
		s := c.either()
		dirtySvc[key(s)] = true
		for _, p := range x.podsByNs[s.Namespace] {
			if c.old != nil && selects(c.old.Spec.Selector, p.Labels) || c.new != nil && selects(c.new.Spec.Selector, p.Labels) {
				dirtyPods[key(p)] = true
			}
		}
		for k, es := range x.slicesBySvc[s.Namespace+"/"+s.Name] {
			dirtySlices[k] = true
			markSlicePods(es)
		}
	}
	for _, c := range sliceCh {
		if c.old != nil {
			markSlicePods(c.old)
		}
		if c.new != nil {
			markSlicePods(c.new)
		}
	}
	ch := &Changes{Addresses: map[string]*workloadapi.Address{}}
	ch.Routes = routesCh
	// A kind of the global unit changed: translate that unit again and
	// redo what the change can reach (globalDirty).
	var global *unit
	if g != nil {
		old := t
		t, global = tr.retranslateGlobal(objs, allocs)
		x = &t.idx
		tr.globalDirty(old, t, g, dirtyPods, dirtySvc, dirtySlices)
		ch.Global, ch.Reason = true, g.kinds()+" changed"
	}
	// A Node change redoes the pods on that node, and only when the
	// locality its labels give changed (status updates change nothing).
	for _, c := range nodeCh {
		n := c.either()
		var loc *workloadapi.Locality
		if c.new != nil {
			loc = locality(c.new.Labels)
		}
		old, known := x.nodes[n.Name]
		if c.new == nil {
			delete(x.nodes, n.Name)
		} else {
			x.nodes[n.Name] = loc
		}
		if known == (c.new != nil) && proto.Equal(old, loc) {
			continue
		}
		for k := range x.podsByNode[n.Name] {
			dirtyPods[k] = true
		}
		ch.Nodes++
	}
	for _, c := range podCh {
		p := c.either()
		dirtyPods[key(p)] = true
		if c.old == nil || c.new == nil { // appeared or vanished: slices naming it
			for k := range x.podRefs[key(p)] {
				dirtySlices[k] = true
			}
		}
		ch.PodChanges = append(ch.PodChanges, PodChange{Old: c.old, New: c.new})
	}

	e := tr.edit()
	warnsChanged := false
	if g != nil {
		warnsChanged = tr.replace(e, ch, tr.global, global)
		tr.global = global
	}
	redo := func(units map[string]*unit, k string, f func()) {
		var u *unit
		if f != nil {
			u = tr.unit(f)
		}
		warnsChanged = tr.replace(e, ch, units[k], u) || warnsChanged
		if u == nil {
			delete(units, k)
		} else {
			units[k] = u
		}
	}
	for k := range dirtySvc {
		var f func()
		if s := x.svcByName[k]; s != nil {
			f = func() { t.translateService(s) }
		}
		redo(tr.services, k, f)
		ch.Services++
	}
	for k := range dirtyPods {
		var f func()
		if p := x.pods[k]; p != nil {
			f = func() { t.translatePod(p) }
		}
		redo(tr.pods, k, f)
		ch.Pods++
	}
	for k := range dirtySlices {
		var f func()
		if es := tr.sliceObj[k]; es != nil {
			f = func() { t.translateEndpointSlice(es) }
		}
		redo(tr.slices, k, f)
		ch.EndpointSlices++
	}
	e.done(tr)
	if warnsChanged {
		tr.sortWarnings()
	}
	if g != nil {
		tr.res = t.result(tr.addrs, tr.warnings)
	} else {
		res := *tr.res
		tr.res = &res
	}
	tr.res.Addresses, tr.res.Warnings, tr.res.bound, tr.res.services = tr.addrs, tr.warnings, tr.bound, objs.Services
	sort.Strings(ch.Removed)
	return tr.res, ch
}

// replace swaps unit old for new in the aggregate and records the change;
// it reports whether the set of warnings changed.
func (tr *Translator) replace(e *edit, ch *Changes, old, new *unit) bool {
	changed := false
	if new != nil {
		for i, k := range new.keys {
			e.set(k, new.addrs[i], tr.global != nil && (new == tr.global || old == tr.global))
			if !ch.Full {
				ch.Addresses[k] = new.addrs[i]
			}
		}
		for _, w := range new.warns {
			tr.warnCount[w]++
			changed = changed || tr.warnCount[w] == 1
		}
	}
	if old != nil {
		for _, k := range old.keys {
			if new == nil || !slices.Contains(new.keys, k) {
				e.delete(k)
				if !ch.Full {
					ch.Removed = append(ch.Removed, k)
				}
			}
		}
		for _, w := range old.warns {
			if tr.warnCount[w]--; tr.warnCount[w] <= 0 {
				delete(tr.warnCount, w)
				changed = true
			}
		}
	}
	return changed
}

// edit changes the addresses and, beside them, the set of those bound to a
// waypoint.
type edit struct {
	all, bound *resmap.Editor[*workloadapi.Address]
}

func (tr *Translator) edit() *edit {
	return &edit{all: resmap.Edit(tr.addrs), bound: resmap.Edit(tr.bound)}
}

func (e *edit) set(k string, a *workloadapi.Address, global bool) {
	if cur, ok := e.all.Get(k); ok && (cur == a || global && proto.Equal(cur, a)) {
		// Unchanged (a re-translated global unit mostly is): keep the
		// shards as they are rather than copy one per address. Units of
		// pods, Services and slices are redone because they changed, so
		// they are not compared.
		return
	}
	e.all.Set(k, a)
	if boundToWaypoint(a) {
		e.bound.Set(k, a)
	} else {
		e.bound.Delete(k)
	}
}

func (e *edit) delete(k string) {
	e.all.Delete(k)
	e.bound.Delete(k)
}

// done stores the edited maps in tr.
func (e *edit) done(tr *Translator) { tr.addrs, tr.bound = e.all.Done(), e.bound.Done() }

// unit runs one object's translation into the scratch sinks and returns
// what it produced (nil: nothing).
func (tr *Translator) unit(f func()) *unit {
	return collect(tr.t, tr.scratchA, tr.scratchW, f)
}

// collect runs f with t's sinks set to the (emptied) scratch maps a and w
// and returns what f put there.
func collect(t *translator, a map[string]*workloadapi.Address, w map[string]bool, f func()) *unit {
	clear(a)
	clear(w)
	t.addresses, t.warnings = a, w
	f()
	if len(a) == 0 && len(w) == 0 {
		return nil
	}
	u := &unit{keys: make([]string, 0, len(a)), addrs: make([]*workloadapi.Address, 0, len(a))}
	for k, v := range a {
		u.keys = append(u.keys, k)
		u.addrs = append(u.addrs, v)
	}
	for k := range w {
		u.warns = append(u.warns, k)
	}
	return u
}

// parallelPodsMin is the pod count from which a full translation
// translates pods on all CPUs.
const parallelPodsMin = 4096

// podUnits translates every pod, on all CPUs for a large set: pod
// translation only reads the indexes and the global results, so each
// worker needs only its own copy of the translator's output sinks.
func (tr *Translator) podUnits(pods []*corev1.Pod) []*unit {
	units := make([]*unit, len(pods))
	workers := runtime.GOMAXPROCS(0)
	if len(pods) < tr.parallelMin || workers < 2 {
		for i, p := range pods {
			units[i] = tr.unit(func() { tr.t.translatePod(p) })
		}
		return units
	}
	var wg sync.WaitGroup
	chunk := (len(pods) + workers - 1) / workers
	for lo := 0; lo < len(pods); lo += chunk {
		hi := min(lo+chunk, len(pods))
		wg.Go(func() {
			tw := *tr.t // shares the indexes; own sinks
			a, w := map[string]*workloadapi.Address{}, map[string]bool{}
			for i := lo; i < hi; i++ {
				units[i] = collect(&tw, a, w, func() { tw.translatePod(pods[i]) })
			}
		})
	}
	wg.Wait()
	return units
}

// full re-translates everything.
func (tr *Translator) full(objs *cluster.Objects, allocs *autoalloc.Allocations, reason string) (*Result, *Changes) {
	t := newTranslator(tr.cfg, objs, allocs)
	tr.t, tr.objs, tr.allocs = t, objs, allocs.List()
	tr.services, tr.pods, tr.slices = map[string]*unit{}, make(map[string]*unit, len(objs.Pods)), map[string]*unit{}
	tr.sliceObj = make(map[string]*discoveryv1.EndpointSlice, len(objs.EndpointSlices))
	tr.warnCount = map[string]int{}
	tr.targetRefPolicies = false
	for _, ap := range objs.AuthorizationPolicies {
		if ap.Spec.TargetRef != nil || len(ap.Spec.TargetRefs) > 0 {
			tr.targetRefPolicies = true
		}
	}

	t.buildIndex()
	ch := &Changes{Full: true, Reason: reason}
	t.apNext = make(map[*securityv1.AuthorizationPolicy]convertedPolicy, len(objs.AuthorizationPolicies))
	tr.global = tr.unit(t.translateGlobal)
	tr.apCache, t.apNext = t.apNext, nil
	tr.addrs, tr.bound = nil, nil
	e := tr.edit()
	tr.replace(e, ch, nil, tr.global)
	for _, s := range objs.Services {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if u := tr.unit(func() { t.translateService(s) }); u != nil {
			tr.services[key(s)] = u
			tr.replace(e, ch, nil, u)
		}
		ch.Services++
	}
	for i, u := range tr.podUnits(objs.Pods) {
		if u != nil {
			tr.pods[key(objs.Pods[i])] = u
			tr.replace(e, ch, nil, u)
		}
		ch.Pods++
	}
	for _, es := range objs.EndpointSlices {
		tr.sliceObj[key(es)] = es
		if u := tr.unit(func() { t.translateEndpointSlice(es) }); u != nil {
			tr.slices[key(es)] = u
			tr.replace(e, ch, nil, u)
		}
		ch.EndpointSlices++
	}
	e.done(tr)
	tr.sortWarnings()
	tr.res = t.result(tr.addrs, tr.warnings)
	tr.res.bound, tr.res.services = tr.bound, objs.Services
	return tr.res, ch
}

func (tr *Translator) sortWarnings() {
	w := make([]string, 0, len(tr.warnCount))
	for k := range tr.warnCount {
		w = append(w, k)
	}
	sort.Strings(w)
	if len(w) == 0 {
		w = nil
	}
	tr.warnings = w
}

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
		authzPolicies:  changed(o.AuthorizationPolicies, objs.AuthorizationPolicies),
		requestAuthns:  changed(o.RequestAuthentications, objs.RequestAuthentications),
		allocs:         !slices.Equal(tr.allocs, allocs.List()),
		anyPeerAuthn:   (len(o.PeerAuthentications) == 0) != (len(objs.PeerAuthentications) == 0),
	}
	if len(g.namespaces)+len(g.serviceEntries)+len(g.peerAuthns)+len(g.gateways) == 0 &&
		!g.authzPolicies && !g.requestAuthns && !g.allocs {
		return nil
	}
	return g
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
// again. The old translator is left as it was, for globalDirty.
func (tr *Translator) retranslateGlobal(objs *cluster.Objects, allocs *autoalloc.Allocations) (*translator, *unit) {
	t := newTranslator(tr.cfg, objs, allocs)
	t.idx = tr.t.idx
	t.indexGlobal()
	tr.t, tr.allocs = t, allocs.List()
	tr.targetRefPolicies = false
	for _, ap := range objs.AuthorizationPolicies {
		if ap.Spec.TargetRef != nil || len(ap.Spec.TargetRefs) > 0 {
			tr.targetRefPolicies = true
		}
	}
	t.apCache, t.apNext = tr.apCache, make(map[*securityv1.AuthorizationPolicy]convertedPolicy, len(objs.AuthorizationPolicies))
	u := tr.unit(t.translateGlobal)
	tr.apCache, t.apCache, t.apNext = t.apNext, nil, nil
	return t, u
}

// translateGlobal translates the kinds that make up the global unit.
func (t *translator) translateGlobal() {
	t.translateWaypoints()
	t.translateAuthorizationPolicies()
	t.translatePeerAuthentications()
	t.translateRequestAuthentications()
	t.indexPolicies()
	t.translateServiceEntries()
	t.translateExternalNames()
	t.translateWorkloadEntries()
	t.translateServiceEntryEndpoints()
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
func (tr *Translator) globalDirty(old, t *translator, g *globalDiff, dirtyPods, dirtySvc, dirtySlices map[string]bool) {
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
		for ns := range keysOf(old.idx.policiesByNs, x.policiesByNs) {
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
	if len(svcNs) > 0 || len(gws) > 0 {
		for k, s := range x.svcByName {
			if svcNs[s.Namespace] || len(gws) > 0 && (refers(s.Labels, s.Namespace) || gwObject(s.Labels, s.Namespace)) {
				dirtySvc[k] = true
			}
		}
	}
	if len(g.namespaces) > 0 {
		for k, es := range tr.sliceObj {
			if svcNs[es.Namespace] {
				dirtySlices[k] = true
			}
		}
	}
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

// serviceNeedsFull says why a Service change cannot be applied to its unit
// and the units that read it alone ("" when it can).
func (tr *Translator) serviceNeedsFull(c objChange[*corev1.Service]) string {
	x := &tr.t.idx
	for _, s := range []*corev1.Service{c.old, c.new} {
		if s == nil {
			continue
		}
		host := tr.t.serviceHostname(s)
		switch {
		case s.Spec.Type == corev1.ServiceTypeExternalName:
			return "ExternalName Service changed"
		case x.seHosts[s.Namespace+"/"+host] || x.seHostnames[host] || x.aliasTargets[host]:
			return "Service hostname shared with a ServiceEntry or alias changed"
		case x.wePerNs[s.Namespace] > 0:
			return "Service in a namespace with WorkloadEntries changed"
		case tr.targetRefPolicies && (c.old == nil || c.new == nil):
			return "Service added or removed while policies have targetRefs"
		}
	}
	return ""
}

// object is what diffing needs of a Kubernetes object.
type object interface {
	comparable
	GetNamespace() string
	GetName() string
	GetResourceVersion() string
	GetUID() types.UID
}

func key[T object](o T) string { return o.GetNamespace() + "/" + o.GetName() }

// same: the same object pointer, or the same object at the same
// resourceVersion (a Source that re-reads objects).
func same[T object](a, b T) bool {
	if a == b {
		return true
	}
	rv := a.GetResourceVersion()
	return rv != "" && rv == b.GetResourceVersion() && a.GetUID() == b.GetUID()
}

type objChange[T object] struct{ old, new T }

func (c objChange[T]) either() T {
	var zero T
	if c.new != zero {
		return c.new
	}
	return c.old
}

func less[T object](a, b T) int {
	if a.GetNamespace() != b.GetNamespace() {
		if a.GetNamespace() < b.GetNamespace() {
			return -1
		}
		return 1
	}
	switch {
	case a.GetName() < b.GetName():
		return -1
	case a.GetName() > b.GetName():
		return 1
	}
	return 0
}

// diff merges two sorted slices: objects added, removed or changed. Equal
// pointers are skipped without comparing names, so an unchanged set of 50k
// pods costs 50k pointer compares.
func diff[T object](a, b []T) []objChange[T] {
	var out []objChange[T]
	var zero T
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i] == b[j] {
			i++
			j++
			continue
		}
		switch c := less(a[i], b[j]); {
		case c == 0:
			if !same(a[i], b[j]) {
				out = append(out, objChange[T]{a[i], b[j]})
			}
			i++
			j++
		case c < 0:
			out = append(out, objChange[T]{a[i], zero})
			i++
		default:
			out = append(out, objChange[T]{zero, b[j]})
			j++
		}
	}
	for ; i < len(a); i++ {
		out = append(out, objChange[T]{a[i], zero})
	}
	for ; j < len(b); j++ {
		out = append(out, objChange[T]{zero, b[j]})
	}
	return out
}

// changed reports whether two sorted slices differ.
func changed[T object](a, b []T) bool {
	if len(a) != len(b) {
		return true
	}
	for i := range a {
		if !same(a[i], b[i]) {
			return true
		}
	}
	return false
}
