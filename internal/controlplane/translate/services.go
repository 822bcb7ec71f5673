package translate

import (
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// ExternalNameAliasExtension names the Service extension ztunnel-go puts on
// an ExternalName Service whose externalName is a mesh service. Its config
// is a google.protobuf.StringValue holding the target hostname. A node proxy
// answers DNS for the alias with a CNAME to the target; routing and policy
// follow the target (the alias has no addresses and no ports of its own).
const ExternalNameAliasExtension = "ztunnel-go.io/external-name-alias"

// addService adds a ServiceEntry host or an ExternalName alias and reports
// whether it was added. Kubernetes Services come first (translateService),
// so a hostname one of them defines in the namespace is taken; among the
// others the first in translation order wins (ServiceEntries are
// translated oldest first, as istiod picks them).
func (t *translator) addService(svc *workloadapi.Service, kind, ns, name string) bool {
	key := svc.Namespace + "/" + svc.Hostname
	if _, dup := t.addresses[key]; dup || t.idx.svcHosts[key] {
		t.warnf(kind, ns, name, "hostname %s is already defined by another object in namespace %s; ignored", svc.Hostname, svc.Namespace)
		return false
	}
	t.addresses[key] = &workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}}
	return true
}

// translateService adds a (non-ExternalName) Service. Two Services never
// share a hostname (it is derived from namespace and name). A Kubernetes
// Service is always canonical for its hostname, as istiod marks it: a
// ServiceEntry of another namespace claiming the same name overrides it
// only for clients of that namespace.
func (t *translator) translateService(s *corev1.Service) {
	network := t.network(s.Labels, s.Namespace)
	svc := &workloadapi.Service{
		Name:      s.Name,
		Namespace: s.Namespace,
		Hostname:  t.serviceHostname(s),
		Canonical: true,
	}
	var fams [2]bool
	for _, ip := range serviceVIPs(s) {
		svc.Addresses = append(svc.Addresses, netAddr(network, ip))
		fams[boolIdx(ip.Is6())] = true
	}
	for _, p := range tcpPorts(s) {
		target := uint32(0)
		if tp, ok := resolveTargetPort(p, nil); ok {
			target = tp
		}
		svc.Ports = append(svc.Ports, &workloadapi.Port{
			ServicePort: uint32(p.Port),
			TargetPort:  target,
			AppProtocol: appProtocol(p.Name, p.AppProtocol),
		})
	}
	svc.LoadBalancing = t.loadBalancing(s)
	svc.IpFamilies = ipFamilies(s.Spec.IPFamilies, fams)
	// A waypoint's own Service never has a waypoint (as istiod decides):
	// bound to itself, a request to it would loop back and be reset.
	if !t.waypointService(s) {
		svc.Waypoint = t.boundWaypoint("Service", s.Namespace, s.Name, s.Labels, false)
		svc.WeightedWaypoints = t.weightedWaypoints("Service", s.Namespace, s.Name, s.Labels, s.Annotations, svc.Waypoint)
	}
	exp, bad := t.serviceExport(s)
	for _, b := range bad {
		t.warnf("Service", s.Namespace, s.Name, "%s", b)
	}
	if exp.none() {
		// Exported to no namespace: no client may resolve or route to it
		// as this service (its ClusterIP stays its own: see ownership.go).
		t.warnf("Service", s.Namespace, s.Name, "exported to no namespace (exportTo ~); not sent to node proxies")
		return
	}
	exp.apply(svc)
	if t.serviceGlobal(s) {
		svc.Extensions = append(svc.Extensions, &workloadapi.Extension{Name: GlobalScopeExtension})
	}
	t.addresses[svc.Namespace+"/"+svc.Hostname] = &workloadapi.Address{Type: &workloadapi.Address_Service{Service: svc}}
}

func boolIdx(b bool) int {
	if b {
		return 1
	}
	return 0
}

// serviceVIPs: clusterIPs (headless: none) plus LoadBalancer ingress IPs.
func serviceVIPs(s *corev1.Service) []netip.Addr {
	cips := s.Spec.ClusterIPs
	if len(cips) == 0 && s.Spec.ClusterIP != "" {
		cips = []string{s.Spec.ClusterIP}
	}
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(v string) {
		if ip, err := netip.ParseAddr(v); err == nil && !seen[ip] {
			seen[ip] = true
			out = append(out, ip)
		}
	}
	for _, c := range cips {
		if c != corev1.ClusterIPNone {
			add(c)
		}
	}
	if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range s.Status.LoadBalancer.Ingress {
			add(in.IP)
		}
	}
	return out
}

// ipFamilies from spec.ipFamilies, or (local-mode YAML, where the API
// server did not default the field) from the families of the VIPs.
func ipFamilies(specFams []corev1.IPFamily, have [2]bool) workloadapi.IPFamilies {
	if len(specFams) > 0 {
		have = [2]bool{}
		for _, f := range specFams {
			have[boolIdx(f == corev1.IPv6Protocol)] = true
		}
	}
	switch {
	case have[0] && have[1]:
		return workloadapi.IPFamilies_DUAL
	case have[0]:
		return workloadapi.IPFamilies_IPV4_ONLY
	case have[1]:
		return workloadapi.IPFamilies_IPV6_ONLY
	}
	return workloadapi.IPFamilies_AUTOMATIC
}

// loadBalancing maps internalTrafficPolicy, trafficDistribution (field, or
// annotation on the Service, then its Namespace) and
// publishNotReadyAddresses. trafficDistribution wins over
// internalTrafficPolicy. nil when none applies.
func (t *translator) loadBalancing(s *corev1.Service) *workloadapi.LoadBalancing {
	var lb *workloadapi.LoadBalancing
	if p := s.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{workloadapi.LoadBalancing_NODE},
			Mode:              workloadapi.LoadBalancing_STRICT,
		}
	}
	td := ""
	if s.Spec.TrafficDistribution != nil {
		td = *s.Spec.TrafficDistribution
	} else if v := s.Annotations[AnnotationTrafficDist]; v != "" {
		td = v
	} else if ns := t.idx.namespaces[s.Namespace]; ns != nil {
		td = ns.Annotations[AnnotationTrafficDist]
	}
	switch td {
	case "":
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone:
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{
				workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
			},
			Mode: workloadapi.LoadBalancing_FAILOVER,
		}
	case corev1.ServiceTrafficDistributionPreferSameNode:
		lb = &workloadapi.LoadBalancing{
			RoutingPreference: []workloadapi.LoadBalancing_Scope{
				workloadapi.LoadBalancing_NETWORK, workloadapi.LoadBalancing_REGION, workloadapi.LoadBalancing_ZONE,
				workloadapi.LoadBalancing_SUBZONE, workloadapi.LoadBalancing_NODE,
			},
			Mode: workloadapi.LoadBalancing_FAILOVER,
		}
	default:
		t.warnf("Service", s.Namespace, s.Name, "unknown trafficDistribution %q ignored", td)
	}
	if s.Spec.PublishNotReadyAddresses {
		if lb == nil {
			lb = &workloadapi.LoadBalancing{}
		}
		lb.HealthPolicy = workloadapi.LoadBalancing_ALLOW_ALL
	}
	return lb
}

// translateServiceEntries adds one Service per ServiceEntry host.
// Addresses may be CIDRs (Istio 1.30): they go out as a NetworkAddress with
// length, and node proxies match a destination inside the range (longest
// prefix) when no service has the exact IP. Resolution NONE is a
// PASSTHROUGH service: node proxies send its traffic to the original
// destination, attributed to the service, without picking an endpoint.
// Oldest ServiceEntries are translated first, so they win a hostname in
// their namespace; markCanonical then picks the canonical one per hostname.
func (t *translator) translateServiceEntries() {
	ses := slices.Clone(t.objs.ServiceEntries)
	slices.SortStableFunc(ses, func(a, b *networkingv1.ServiceEntry) int {
		switch {
		case olderMeta(&a.ObjectMeta, &b.ObjectMeta):
			return -1
		case olderMeta(&b.ObjectMeta, &a.ObjectMeta):
			return 1
		}
		return 0
	})
	claims := map[string][]seClaim{}
	// The owned addresses (every pod's, node's and Service's) are indexed
	// only when some entry names addresses: at 50k pods that costs more
	// than the rest of a re-translation of ServiceEntries and policies.
	var own *owned
	var taken []addrClaim
	for _, se := range ses {
		network := t.network(se.Labels, se.Namespace)
		var parsed []parsedAddr
		for i, a := range se.Spec.Addresses {
			if p, err := netip.ParsePrefix(a); err == nil {
				parsed = append(parsed, parsedAddr{index: i, prefix: p})
			} else if ip, err := netip.ParseAddr(a); err == nil {
				parsed = append(parsed, parsedAddr{index: i, prefix: netip.PrefixFrom(ip, ip.BitLen())})
			} else {
				t.warnf("ServiceEntry", se.Namespace, se.Name, "address %q is not an IP or CIDR; ignored", a)
			}
		}
		for _, pa := range parsed {
			t.seAddrs = append(t.seAddrs, pa.prefix)
		}
		if len(parsed) > 0 && own == nil {
			own = t.buildOwned()
		}
		var refused []string
		var fixed []*workloadapi.NetworkAddress
		exp, expBad := t.serviceEntryExport(se)
		for _, pa := range own.claimAddresses(se, exp, parsed, &taken, &refused) {
			p := pa.prefix
			na := netAddr(network, p.Addr())
			if p.Bits() != p.Addr().BitLen() {
				l := uint32(p.Bits())
				na.Length = &l
				if r := se.Spec.Resolution; r != networkingv1alpha3.ServiceEntry_NONE && r != networkingv1alpha3.ServiceEntry_STATIC {
					t.warnf("ServiceEntry", se.Namespace, se.Name, "CIDR address %s with resolution %s: Istio admits CIDRs only with resolution NONE or STATIC; every address in the range is sent to the resolved host", se.Spec.Addresses[pa.index], r)
				}
			}
			fixed = append(fixed, na)
		}
		if len(refused) > 0 || len(expBad) > 0 || exp.none() {
			var msg []string
			switch {
			case len(refused) > 0 && len(fixed) == 0:
				msg = append(msg, "every address is refused (owned by others); its hosts have no address")
			case len(refused) > 0:
				msg = append(msg, "addresses owned by others are refused; the rest of the ServiceEntry applies")
			}
			if exp.none() {
				msg = append(msg, "visible to no namespace; not sent to node proxies")
			} else if len(expBad) > 0 {
				msg = append(msg, "visible to its own namespace only")
			}
			t.policies = append(t.policies, PolicyStatus{Kind: "ServiceEntry", Name: se.Namespace + "/" + se.Name,
				Sent: !exp.none(), Message: strings.Join(msg, "; "), Invalid: append(refused, expBad...)})
		}
		if exp.none() {
			continue
		}
		var ports []*workloadapi.Port
		for _, p := range se.Spec.Ports {
			if !tcpProtocol(p.Protocol) {
				continue
			}
			target := p.TargetPort
			if target == 0 {
				target = p.Number // istiod's default: the port number
			}
			ports = append(ports, &workloadapi.Port{
				ServicePort: p.Number,
				TargetPort:  target,
				AppProtocol: protocolFromString(p.Protocol),
			})
		}
		var lb *workloadapi.LoadBalancing
		if se.Spec.Resolution == networkingv1alpha3.ServiceEntry_NONE {
			lb = &workloadapi.LoadBalancing{
				Mode:         workloadapi.LoadBalancing_PASSTHROUGH,
				HealthPolicy: workloadapi.LoadBalancing_ALLOW_ALL,
			}
		}
		wp := t.boundWaypoint("ServiceEntry", se.Namespace, se.Name, se.Labels, false)
		wws := t.weightedWaypoints("ServiceEntry", se.Namespace, se.Name, se.Labels, se.Annotations, wp)
		for _, h := range se.Spec.Hosts {
			svc := &workloadapi.Service{
				Name:            se.Name,
				Namespace:       se.Namespace,
				Hostname:        h,
				Addresses:       fixed,
				Ports:           ports,
				SubjectAltNames: se.Spec.SubjectAltNames,
				LoadBalancing:   lb,
				Waypoint:        wp,
			}
			svc.WeightedWaypoints = wws
			exp.apply(svc)
			if len(parsed) == 0 {
				var fams [2]bool
				for _, ip := range t.allocs.Lookup(se.Namespace, se.Name, h) {
					svc.Addresses = append(svc.Addresses, netAddr(network, ip))
					fams[boolIdx(ip.Is6())] = true
				}
			}
			if strings.HasPrefix(h, "*") && len(svc.Addresses) == 0 {
				t.warnf("ServiceEntry", se.Namespace, se.Name, "wildcard host %s has no address (auto-allocation needs resolution DYNAMIC_DNS); node proxies cannot match it", h)
			}
			if t.addService(svc, "ServiceEntry", se.Namespace, se.Name) {
				claims[h] = append(claims[h], seClaim{svc: svc, meta: &se.ObjectMeta})
			}
		}
	}
	t.markCanonical(claims)
}

// seClaim is a ServiceEntry host that won its namespace.
type seClaim struct {
	svc  *workloadapi.Service
	meta *metav1.ObjectMeta
}

// markCanonical sets canonical on one Service per hostname, istiod's rule:
// a Kubernetes Service with that hostname is canonical (translateService),
// so no ServiceEntry is; otherwise the oldest ServiceEntry among the
// namespace winners (claims are in that order) that is not visible to its
// own namespace only. Node proxies prefer the canonical service when
// several namespaces define a hostname or share a VIP and none is the
// client's.
func (t *translator) markCanonical(claims map[string][]seClaim) {
	for h, cs := range claims {
		if t.idx.kubeHosts[h] {
			continue
		}
		for _, c := range cs {
			if c.svc.Visibility != workloadapi.Service_NAMESPACE {
				c.svc.Canonical = true
				break
			}
		}
	}
}

// tcpProtocol reports whether an Istio port protocol is carried over TCP.
func tcpProtocol(p string) bool {
	switch strings.ToUpper(p) {
	case "UDP":
		return false
	}
	return true
}

func (t *translator) translateExternalNames() {
	for _, s := range t.objs.Services {
		if s.Spec.Type != corev1.ServiceTypeExternalName {
			continue
		}
		if !t.cfg.EnableExternalNameAlias {
			continue
		}
		target := strings.TrimSuffix(strings.ToLower(s.Spec.ExternalName), ".")
		if !t.idx.isMeshHost(target) {
			t.warnf("Service", s.Namespace, s.Name, "externalName %s is not a mesh service; not an alias (DNS is forwarded)", s.Spec.ExternalName)
			continue
		}
		cfg, err := anypb.New(wrapperspb.String(target))
		if err != nil {
			continue // cannot happen for a StringValue
		}
		t.addService(&workloadapi.Service{
			Name:       s.Name,
			Namespace:  s.Namespace,
			Hostname:   t.serviceHostname(s),
			Extensions: []*workloadapi.Extension{{Name: ExternalNameAliasExtension, Config: cfg}},
		}, "Service", s.Namespace, s.Name)
	}
}

// waypointService reports whether s fronts a waypoint: it carries the
// waypoint controller's managed label, or its gateway-name label names a
// Gateway of class istio-waypoint in its namespace.
func (t *translator) waypointService(s *corev1.Service) bool {
	if s.Labels[LabelGatewayManaged] == ManagedMeshController {
		return true
	}
	gw, ok := s.Labels[LabelGatewayName]
	if !ok {
		return false
	}
	for _, g := range t.objs.Gateways {
		if g.Namespace == s.Namespace && g.Name == gw && string(g.Spec.GatewayClassName) == WaypointClass {
			return true
		}
	}
	return false
}
