package translate

import (
	"bytes"
	"runtime"
	"slices"
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

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
	// eqBuf: encodings of two addresses being compared (edit.set).
	eqBuf [2][]byte
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
	// Addresses holds the resources re-translated whose content changed,
	// by name (a re-translation equal to the current resource keeps that
	// one, and is not listed); Removed the names that are gone.
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

	// waypointInputs: the global unit changed in a way waypoint configs
	// may read beyond the addresses and policy statuses
	// (WaypointConfigsAffected): a kind other than Namespace,
	// AuthorizationPolicy and PeerAuthentication changed, an
	// AuthorizationPolicy with targetRefs exists (before or after), or
	// some waypoint's translation changed.
	waypointInputs bool
	// services: the address keys ("ns/hostname") of the Service objects
	// that changed (their ports' names shape waypoint configs even when
	// the address is equal); servicesAddedOrRemoved: one of them came or
	// went (routes' backendRefs resolve against the Services that exist).
	services               []string
	servicesAddedOrRemoved bool
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
	for _, c := range svcCh {
		s := c.either()
		ch.services = append(ch.services, s.Namespace+"/"+t.serviceHostname(s))
		ch.servicesAddedOrRemoved = ch.servicesAddedOrRemoved || c.old == nil || c.new == nil
	}
	// A kind of the global unit changed: translate that unit again and
	// redo what the change can reach (globalDirty).
	var global *unit
	if g != nil {
		old, oldTargetRefs := t, tr.targetRefPolicies
		t, global = tr.retranslateGlobal(objs, allocs, !g.authzPolicies,
			len(g.peerAuthns) == 0 && !g.anyPeerAuthn && !g.requestAuthns, g.authzPolicyNs)
		x = &t.idx
		wpsChanged := tr.globalDirty(objs, old, t, g, dirtyPods, dirtySvc, dirtySlices)
		ch.Global, ch.Reason = true, g.kinds()+" changed"
		// Waypoint configs read AuthorizationPolicies only when they
		// have targetRefs (attached to waypoints, or to Services and
		// ServiceEntries bound to one), and PeerAuthentications not at
		// all: without such policies before and after, a policy change
		// reaches them only through the addresses and statuses it
		// changes (WaypointConfigsAffected compares those).
		ch.waypointInputs = wpsChanged || !g.onlyNamespacesAndPolicies() || oldTargetRefs || tr.targetRefPolicies
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
			a, stored := e.set(k, new.addrs[i])
			new.addrs[i] = a
			if stored && !ch.Full {
				ch.Addresses[k] = a
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
	buf        *[2][]byte
}

func (tr *Translator) edit() *edit {
	return &edit{all: resmap.Edit(tr.addrs), bound: resmap.Edit(tr.bound), buf: &tr.eqBuf}
}

// set stores a as k unless the resource stored is equal; it returns the
// resource k holds and whether it changed.
func (e *edit) set(k string, a *workloadapi.Address) (*workloadapi.Address, bool) {
	if cur, ok := e.all.Get(k); ok && (cur == a || !differs(cur, a) && e.equal(cur, a)) {
		// Unchanged (a re-translated global unit mostly is, and so are
		// the pods and Services of a namespace whose labels changed in
		// ways they do not read): keep the resource as it is rather than
		// copy a shard per address and push it again.
		return cur, false
	}
	e.all.Set(k, a)
	if boundToWaypoint(a) {
		e.bound.Set(k, a)
	} else {
		e.bound.Delete(k)
	}
	return a, true
}

// equal: a and b have the same deterministic encoding (then they are the
// same resource to every reader; the generated encoder is several times
// cheaper than proto.Equal's reflection, and the buffers are reused).
// An address that cannot be encoded is not equal to anything.
func (e *edit) equal(a, b *workloadapi.Address) bool {
	opts := proto.MarshalOptions{Deterministic: true}
	var err error
	if e.buf[0], err = opts.MarshalAppend(e.buf[0][:0], a); err != nil {
		return false
	}
	if e.buf[1], err = opts.MarshalAppend(e.buf[1][:0], b); err != nil {
		return false
	}
	return bytes.Equal(e.buf[0], e.buf[1])
}

// differs is a cheap first look before comparing encodings (equal): true when a scalar
// that a change of a pod or Service usually moves differs (a namespace's
// dataplane mode flips every workload's tunnel protocol). false says
// nothing.
func differs(a, b *workloadapi.Address) bool {
	if wa, wb := a.GetWorkload(), b.GetWorkload(); wa != nil && wb != nil {
		return wa.GetTunnelProtocol() != wb.GetTunnelProtocol() || wa.GetStatus() != wb.GetStatus() ||
			wa.GetNetworkMode() != wb.GetNetworkMode() || wa.GetNode() != wb.GetNode() ||
			len(wa.GetServices()) != len(wb.GetServices()) || len(wa.GetAuthorizationPolicies()) != len(wb.GetAuthorizationPolicies())
	}
	if sa, sb := a.GetService(), b.GetService(); sa != nil && sb != nil {
		return len(sa.GetPorts()) != len(sb.GetPorts()) || len(sa.GetAddresses()) != len(sb.GetAddresses())
	}
	return (a.GetWorkload() == nil) != (b.GetWorkload() == nil)
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
