package translate

import (
	"bytes"
	"maps"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// EnforcedByWaypoint starts the status message of a targetRef policy that a
// waypoint of ours enforces; the waypoints follow ("ns/name, ...").
const EnforcedByWaypoint = "enforced by waypoint "

// WaypointConfigs builds the waypointapi.Config of every waypoint Gateway
// (class istio-waypoint) that has an address, keyed by its xDS resource name
// "<namespace>/<name>", from the objects and their translation res: the
// services and workloads res binds to the waypoint, the AuthorizationPolicies
// attached to it (targetRefs to the Gateway, to GatewayClass istio-waypoint
// from the root namespace, or to a Service or ServiceEntry bound to it) and
// the HTTPRoutes and GRPCRoutes (parentRefs kind Service or ServiceEntry)
// of its services, and the Telemetry API resolved for it (telemetry.go).
//
// It also returns res.Policies with the status of every policy that a
// config carries rewritten to say which waypoints enforce it (node proxies
// still never get it). Policy values a waypoint cannot enforce fail closed as
// for node proxies: an ALLOW rule is dropped, a DENY rule matches every
// request; each is named in the status. Pure, like Translate.
func WaypointConfigs(cfg Config, objs *cluster.Objects, res *Result) (map[string]*waypointapi.Config, []PolicyStatus) {
	return waypointConfigs(cfg, objs, res, nil, nil)
}

// UpdateWaypointConfigs is WaypointConfigs for the translation res after
// the change wc (WaypointConfigsAffected), given prev, WaypointConfigs'
// configs for the translation before: it builds only the configs of the
// waypoints wc names and keeps the others of prev. ok is false when it
// cannot: wc.All, or the statuses gather what every config attaches
// (VirtualServices, DestinationRules, Telemetry, RequestAuthentications
// or AuthorizationPolicies with targetRefs exist); call WaypointConfigs.
func UpdateWaypointConfigs(cfg Config, objs *cluster.Objects, res *Result, prev map[string]*waypointapi.Config, wc WaypointChange) (map[string]*waypointapi.Config, []PolicyStatus, bool) {
	if wc.All || objs == nil || res == nil || len(objs.VirtualServices)+len(objs.DestinationRules)+len(objs.Telemetries)+len(objs.RequestAuthentications) > 0 ||
		slices.ContainsFunc(objs.AuthorizationPolicies, func(ap *securityv1.AuthorizationPolicy) bool { return len(targetRefs(ap)) > 0 }) {
		return nil, nil, false
	}
	out, st := waypointConfigs(cfg, objs, res, prev, wc.gateways)
	return out, st, true
}

// waypointConfigs is WaypointConfigs; with rebuild non-nil, a waypoint
// whose address (gatewayKey) is not in rebuild keeps its config of prev
// (when it has one) instead of being built.
func waypointConfigs(cfg Config, objs *cluster.Objects, res *Result, prev map[string]*waypointapi.Config, rebuild map[string]bool) (map[string]*waypointapi.Config, []PolicyStatus) {
	cfg = cfg.withDefaults()
	out := map[string]*waypointapi.Config{}
	if objs == nil || res == nil {
		return out, res.policiesOrNil()
	}
	t := newTranslator(cfg, objs, nil)
	// VirtualServices and DestinationRules (virtualservice.go) report what
	// became of them even when no waypoint exists.
	ir := newIstioRouting(t, res)
	tel := newTelemetries(cfg, objs.Telemetries)
	if !slices.ContainsFunc(objs.Gateways, func(g *gatewayv1.Gateway) bool {
		return string(g.Spec.GatewayClassName) == WaypointClass
	}) {
		return out, append(append(slices.Clone(res.Policies), ir.statuses()...), tel.statuses()...)
	}
	t.servicesSorted = res.sortedServices(objs.Services)
	t.buildIndexOf(false)
	t.translateWaypoints()

	authn := newAuthnState()
	enforcedBy := map[string][]string{} // policy ns/name → waypoints
	problemsOf := map[string][]string{}
	policies := map[string]*securityv1.AuthorizationPolicy{}
	for _, ap := range objs.AuthorizationPolicies {
		policies[ap.Namespace+"/"+ap.Name] = ap
	}
	byWaypoint := addressesByWaypoint(res, rebuild)
	for _, key := range sortedKeys(t.idx.waypoints) {
		w := t.idx.waypoints[key]
		if c, ok := prev[key]; ok && rebuild != nil && !rebuild[gatewayKey(w.addr)] {
			out[key] = c
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		c := &waypointapi.Config{
			Name: name, Namespace: ns, TrafficType: w.trafficType,
			// The waypoint Deployment runs as a ServiceAccount named after
			// the Gateway, as istiod's waypoint controller creates it.
			Identity:          "spiffe://" + cfg.TrustDomain + "/ns/" + ns + "/sa/" + name,
			PathNormalization: cfg.PathNormalization,
		}
		if a := w.addr.GetAddress(); a != nil {
			c.Addresses = [][]byte{a.GetAddress()}
		}
		bound := t.boundTo(w, byWaypoint[gatewayKey(w.addr)], c, ir)
		// Telemetry API (telemetry.go): root namespace, the waypoint's
		// namespace and its targetRefs; per service for Service targetRefs.
		var base *telemetryMerge
		c.Telemetry, base = tel.forWaypoint(ns, name)
		for _, s := range c.Services {
			s.Telemetry = tel.forService(base, key, name+"."+ns, s)
		}
		var required []*waypointapi.Policy
		c.Authentications, required = t.authnFor(key, bound, authn)
		c.Policies = append(c.Policies, required...)
		attach := func(pkey string, services []string, target string) {
			ap := policies[pkey]
			if ap == nil {
				return
			}
			p, bad := convertWaypointPolicy(ap)
			p.Services, p.Target = services, target
			c.Policies = append(c.Policies, p)
			if !slices.Contains(enforcedBy[pkey], key) {
				enforcedBy[pkey] = append(enforcedBy[pkey], key)
			}
			problemsOf[pkey] = bad
		}
		for _, pkey := range res.WaypointPolicies[key] {
			attach(pkey, nil, "Gateway "+key)
		}
		for _, ap := range objs.AuthorizationPolicies {
			var hosts, targets []string
			for _, r := range targetRefs(ap) {
				if r.namespace != "" && r.namespace != ap.Namespace {
					continue
				}
				if h, ok := bound[r.kind+" "+ap.Namespace+"/"+r.name]; ok && (r.group == "" && r.kind == "Service" || r.group == "networking.istio.io" && r.kind == "ServiceEntry") {
					hosts = append(hosts, h...)
					targets = append(targets, r.kind+" "+ap.Namespace+"/"+r.name)
				}
			}
			if len(hosts) > 0 {
				attach(ap.Namespace+"/"+ap.Name, dedupe(hosts), strings.Join(targets, ", "))
			}
		}
		sort.SliceStable(c.Policies, func(i, j int) bool {
			return c.Policies[i].Namespace+"/"+c.Policies[i].Name < c.Policies[j].Namespace+"/"+c.Policies[j].Name
		})
		out[key] = c
	}
	statuses := append(append(slices.Clone(res.Policies), ir.statuses()...), tel.statuses()...)
	for i := range statuses {
		st := &statuses[i]
		if st.Kind == kindRA {
			setAuthnStatus(st, authn)
			continue
		}
		wps := enforcedBy[st.Name]
		if st.Kind != "AuthorizationPolicy" || len(wps) == 0 {
			continue
		}
		sort.Strings(wps)
		st.Message = EnforcedByWaypoint + strings.Join(wps, ", ") + " (targetRefs make it a waypoint policy; node proxies never get it)"
		if bad := problemsOf[st.Name]; len(bad) > 0 {
			st.Invalid = bad
			st.Message += "; values that cannot be enforced fail closed: " + strings.Join(bad, "; ")
		}
	}
	return out, statuses
}

// boundTo fills c's services and workloads from res (those whose waypoint is
// w's address) with the routes attached to each service, and returns the
// hostnames of each bound "Service ns/name" and "ServiceEntry ns/name".
func (t *translator) boundTo(w *waypoint, candidates []*workloadapi.Address, c *waypointapi.Config, ir *istioRouting) map[string][]string {
	bound := map[string][]string{}
	for _, a := range candidates {
		switch {
		case a.GetService() != nil && waypointOf(a.GetService(), w.addr) && w.forService:
			s := a.GetService()
			kind := "ServiceEntry"
			if k8s := t.service(s.GetNamespace(), s.GetName()); k8s != nil && t.serviceHostname(k8s) == s.GetHostname() {
				kind = "Service"
			}
			ws := &waypointapi.Service{Name: s.GetName(), Namespace: s.GetNamespace(), Hostname: s.GetHostname(), Kind: kind}
			for _, na := range s.GetAddresses() {
				ws.Addresses = append(ws.Addresses, na.GetAddress())
			}
			for _, p := range s.GetPorts() {
				ws.Ports = append(ws.Ports, t.waypointPort(kind, s, p))
			}
			ws.Routes = ir.routes(w.key, s, t.routesFor(kind, s))
			c.Services = append(c.Services, ws)
			bk := kind + " " + s.GetNamespace() + "/" + s.GetName()
			bound[bk] = append(bound[bk], s.GetHostname())
		case a.GetWorkload() != nil && proto.Equal(a.GetWorkload().GetWaypoint(), w.addr) && w.forWorkload:
			wl := a.GetWorkload()
			c.Workloads = append(c.Workloads, &waypointapi.Workload{
				Uid: wl.GetUid(), Name: wl.GetName(), Namespace: wl.GetNamespace(), Addresses: wl.GetAddresses(),
			})
		}
	}
	sort.Slice(c.Services, func(i, j int) bool {
		return c.Services[i].Namespace+"/"+c.Services[i].Hostname < c.Services[j].Namespace+"/"+c.Services[j].Hostname
	})
	sort.Slice(c.Workloads, func(i, j int) bool { return c.Workloads[i].Uid < c.Workloads[j].Uid })
	return bound
}

// addressesByWaypoint groups the addresses bound to a waypoint by
// gatewayKey of each waypoint address they name (a Workload's, a
// Service's, its weighted ones'), so that each waypoint looks only at its
// own candidates (boundTo still checks each one) instead of every address.
// only, when not nil, limits it to those keys.
func addressesByWaypoint(res *Result, only map[string]bool) map[string][]*workloadapi.Address {
	out := map[string][]*workloadapi.Address{}
	for _, a := range res.waypointBound() {
		if w := a.GetWorkload(); w != nil {
			if ga := w.GetWaypoint(); ga != nil {
				if k := gatewayKey(ga); only == nil || only[k] {
					out[k] = append(out[k], a)
				}
			}
			continue
		}
		s := a.GetService()
		var keys []string
		add := func(ga *workloadapi.GatewayAddress) {
			if ga == nil {
				return
			}
			if k := gatewayKey(ga); (only == nil || only[k]) && !slices.Contains(keys, k) {
				keys = append(keys, k)
				out[k] = append(out[k], a)
			}
		}
		add(s.GetWaypoint())
		for _, ww := range s.GetWeightedWaypoints() {
			add(ww.GetDestination())
		}
	}
	return out
}

// gatewayKey is a key of a waypoint address: equal (proto.Equal) addresses
// have equal keys.
func gatewayKey(ga *workloadapi.GatewayAddress) string {
	if h := ga.GetHostname(); h != nil {
		return "h/" + h.GetNamespace() + "/" + h.GetHostname()
	}
	return "a/" + ga.GetAddress().GetNetwork() + "/" + string(ga.GetAddress().GetAddress())
}

// waypointPort decides the protocol of a service port as Istio does:
// appProtocol, else the port name's prefix (a ServiceEntry port: its
// protocol); HTTP/1.1 for http, HTTP/2 for http2, h2c and grpc, TCP for
// the protocols Istio knows that carry no HTTP a proxy can read (tcp, tls,
// https, mongo, mysql, redis, ...), and AUTO (sniffing in the waypoint) for
// a port that declares none of these.
func (t *translator) waypointPort(kind string, s *workloadapi.Service, p *workloadapi.Port) *waypointapi.Port {
	wp := &waypointapi.Port{Port: p.GetServicePort()}
	declared := ""
	if kind == "Service" {
		if k8s := t.service(s.GetNamespace(), s.GetName()); k8s != nil {
			for _, sp := range k8s.Spec.Ports {
				if uint32(sp.Port) == p.GetServicePort() {
					wp.Name = sp.Name
					declared = portNamePrefix(sp.Name)
					if sp.AppProtocol != nil && *sp.AppProtocol != "" {
						declared = *sp.AppProtocol
					}
				}
			}
		}
	}
	switch p.GetAppProtocol() {
	case workloadapi.AppProtocol_HTTP11:
		wp.Protocol = waypointapi.Protocol_HTTP
	case workloadapi.AppProtocol_HTTP2, workloadapi.AppProtocol_GRPC:
		wp.Protocol = waypointapi.Protocol_HTTP2
	case workloadapi.AppProtocol_TCP, workloadapi.AppProtocol_TLS:
		wp.Protocol = waypointapi.Protocol_TCP
	default:
		if kind != "Service" {
			// A ServiceEntry port's protocol was read into AppProtocol;
			// UNKNOWN is one Istio does not carry HTTP on, or none.
			declared = t.seProtocol(s, p.GetServicePort())
		}
		wp.Protocol = protocolOf(declared)
	}
	return wp
}

// portNamePrefix is the part of a port name Istio reads a protocol from:
// up to the first "-" ("http-web": "http"), or the whole name.
func portNamePrefix(name string) string {
	if i := strings.IndexByte(name, '-'); i >= 0 {
		return name[:i]
	}
	return name
}

// protocolOf maps a declared protocol (appProtocol, a port name prefix, a
// ServiceEntry port protocol) to how the waypoint serves it: Istio's
// protocol names, case-insensitive; anything else (or nothing) is AUTO,
// Istio's "unsupported" that it sniffs.
func protocolOf(declared string) waypointapi.Protocol {
	switch strings.ToLower(declared) {
	case "http", "http1", "http/1.1", "kubernetes.io/ws", "http_proxy":
		return waypointapi.Protocol_HTTP
	case "http2", "h2c", "kubernetes.io/h2c", "grpc", "grpc-web":
		return waypointapi.Protocol_HTTP2
	case "tcp", "udp", "tls", "https", "kubernetes.io/wss", "mongo", "mysql", "redis":
		return waypointapi.Protocol_TCP
	}
	return waypointapi.Protocol_AUTO
}

// seProtocol is the protocol of the ServiceEntry port number of the
// ServiceEntry behind s ("" when not found).
func (t *translator) seProtocol(s *workloadapi.Service, port uint32) string {
	for _, se := range t.objs.ServiceEntries {
		if se.Namespace != s.GetNamespace() || !slices.Contains(se.Spec.GetHosts(), s.GetHostname()) {
			continue
		}
		for _, p := range se.Spec.GetPorts() {
			if p.GetNumber() == port {
				return p.GetProtocol()
			}
		}
	}
	return ""
}

func (r *Result) policiesOrNil() []PolicyStatus {
	if r == nil {
		return nil
	}
	return r.Policies
}

// WaypointChange is which waypoint configs a change can alter
// (WaypointConfigsAffected): all of them (and the statuses), or only
// those of the waypoints whose address is among gateways (gatewayKey).
type WaypointChange struct {
	All      bool
	gateways map[string]bool
}

// None: no config can have changed.
func (w WaypointChange) None() bool { return !w.All && len(w.gateways) == 0 }

// Waypoints is how many waypoint addresses are named (not when All).
func (w WaypointChange) Waypoints() int { return len(w.gateways) }

// WaypointConfigsAffected says which waypoint configs, and whether the
// statuses, WaypointConfigs may answer otherwise for after than for
// before, the translation that the incremental change ch (of Update, or
// of Merge after it) turned into after; objs are after's objects. A
// config the answer leaves out reads nothing that changed, so the caller
// may keep the one it built for before.
//
// What WaypointConfigs reads: the waypoints' translation (Gateways,
// GatewayClasses, their namespace's labels); the addresses bound to a
// waypoint (of a Workload only what boundTo copies, of a Service all) and
// the Kubernetes Services behind them (port names); which Services exist
// (routes' backendRefs); the AuthorizationPolicies with targetRefs, the
// RequestAuthentications and every policy's status; the routes,
// VirtualServices, DestinationRules and Telemetry (ch.Routes); every
// workload while DestinationRules or VirtualService sourceLabels exist
// (subsets and clients list workloads). A Namespace reaches them only
// through the addresses it re-translates and the waypoints' translation
// (network label, allowedRoutes selectors); an AuthorizationPolicy
// without targetRefs (while none has them) or a PeerAuthentication only
// through the addresses and statuses; any other global kind is All, as
// is any doubt. A bound address that
// changed names the waypoints it is and was bound to.
func WaypointConfigsAffected(before, after *Result, objs *cluster.Objects, ch *Changes) WaypointChange {
	all := WaypointChange{All: true}
	if before == nil || after == nil || objs == nil || ch.Full || ch.Routes || ch.waypointInputs {
		return all
	}
	if ch.Global && (!slices.EqualFunc(before.Policies, after.Policies, samePolicyStatus) ||
		!maps.EqualFunc(before.WaypointPolicies, after.WaypointPolicies, slices.Equal[[]string])) {
		return all
	}
	// A route's backendRef resolves only to a Service that exists.
	if ch.servicesAddedOrRemoved && len(objs.HTTPRoutes)+len(objs.GRPCRoutes)+len(objs.VirtualServices) > 0 {
		return all
	}
	everyWorkload := len(objs.DestinationRules) > 0 || anySourceLabels(objs.VirtualServices)
	var w WaypointChange
	name := func(a *workloadapi.Address) {
		if a == nil || !boundToWaypoint(a) {
			return
		}
		if w.gateways == nil {
			w.gateways = map[string]bool{}
		}
		if wl := a.GetWorkload(); wl != nil {
			w.gateways[gatewayKey(wl.GetWaypoint())] = true
			return
		}
		s := a.GetService()
		if ga := s.GetWaypoint(); ga != nil {
			w.gateways[gatewayKey(ga)] = true
		}
		for _, ww := range s.GetWeightedWaypoints() {
			if ga := ww.GetDestination(); ga != nil {
				w.gateways[gatewayKey(ga)] = true
			}
		}
	}
	// A bound Service's config also reads its Kubernetes object (port
	// names), which may change while its address stays equal.
	for _, k := range ch.services {
		old, _ := before.Addresses.Get(k)
		a, _ := after.Addresses.Get(k)
		name(old)
		name(a)
	}
	for k, a := range ch.Addresses {
		old, ok := before.Addresses.Get(k)
		switch {
		case ok && old == a:
		case everyWorkload && (!ok || !proto.Equal(old, a)):
			return all
		case ok && sameForWaypoint(old, a):
		default:
			name(old)
			name(a)
		}
	}
	for _, k := range ch.Removed {
		if old, ok := before.Addresses.Get(k); ok {
			if everyWorkload {
				return all
			}
			name(old)
		}
	}
	return w
}

// sameForWaypoint: a and b, two translations of one address, give the
// same waypoint configs: of a Workload, boundTo and addressesByWaypoint
// read only its waypoint, uid, name, namespace and addresses; a Service
// must be equal as a whole (routes, ports, telemetry read it; its
// Kubernetes object's changes are Changes.services).
func sameForWaypoint(a, b *workloadapi.Address) bool {
	wa, wb := a.GetWorkload(), b.GetWorkload()
	if wa == nil || wb == nil {
		return wa == nil && wb == nil && proto.Equal(a, b)
	}
	return wa.GetUid() == wb.GetUid() && wa.GetName() == wb.GetName() && wa.GetNamespace() == wb.GetNamespace() &&
		slices.EqualFunc(wa.GetAddresses(), wb.GetAddresses(), bytes.Equal) && proto.Equal(wa.GetWaypoint(), wb.GetWaypoint())
}

func samePolicyStatus(a, b PolicyStatus) bool {
	return a.Kind == b.Kind && a.Name == b.Name && a.Sent == b.Sent && a.Message == b.Message && a.DryRun == b.DryRun &&
		slices.Equal(a.Invalid, b.Invalid)
}
