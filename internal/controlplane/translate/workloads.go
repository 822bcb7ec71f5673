package translate

import (
	"net/netip"
	"sort"
	"strings"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// Pod enrollment: see Config.EnrollmentFromLabels.
func (t *translator) enrolled(p *corev1.Pod) bool {
	if p.Annotations[AnnotationRedirection] == "enabled" {
		return true
	}
	if !t.cfg.EnrollmentFromLabels || p.Spec.HostNetwork {
		return false
	}
	if _, sidecar := p.Annotations[AnnotationSidecarStatus]; sidecar {
		return false
	}
	switch p.Labels[LabelDataplaneMode] {
	case "ambient":
		return true
	case "none":
		return false
	}
	return t.nsLabels(p.Namespace)[LabelDataplaneMode] == "ambient"
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	// The kubelet always writes conditions; a pod with none comes from
	// hand-written local-mode YAML and is taken as ready.
	if len(p.Status.Conditions) == 0 {
		return true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && !seen[ip] {
			seen[ip] = true
			out = append(out, ip)
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	add(p.Status.PodIP)
	return out
}

// canonical returns canonical name and revision from labels, falling back
// to the workload name and "latest" as istiod does (pkg/config/labels
// CanonicalService): the first of the labels present wins, even when its
// value is empty.
func canonical(labels map[string]string, workloadName string) (string, string) {
	name, ok := firstLabel(labels, "service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
	if !ok {
		name = workloadName
	}
	rev, ok := firstLabel(labels, "service.istio.io/canonical-revision", "app.kubernetes.io/version", "version")
	if !ok {
		rev = "latest"
	}
	return name, rev
}

func firstLabel(labels map[string]string, keys ...string) (string, bool) {
	for _, k := range keys {
		if v, ok := labels[k]; ok {
			return v, true
		}
	}
	return "", false
}

// workloadNameAndType derives the owning workload: a ReplicaSet owned the
// Deployment way (name = deployment + "-" + pod-template-hash) is a
// DEPLOYMENT, a Job a JOB, a CronJob's Job (name = cronjob + "-" + digits)
// a CRONJOB; anything else is a POD named after its owner, or after itself
// when it has none.
func workloadNameAndType(p *corev1.Pod) (string, workloadapi.WorkloadType) {
	var owner *struct{ kind, name string }
	for _, r := range p.OwnerReferences {
		if r.Controller != nil && *r.Controller || owner == nil {
			owner = &struct{ kind, name string }{r.Kind, r.Name}
		}
	}
	if owner == nil {
		return p.Name, workloadapi.WorkloadType_POD
	}
	switch owner.kind {
	case "ReplicaSet":
		if h := p.Labels[LabelPodTemplateHash]; h != "" && strings.HasSuffix(owner.name, "-"+h) {
			return strings.TrimSuffix(owner.name, "-"+h), workloadapi.WorkloadType_DEPLOYMENT
		}
	case "Job":
		if i := strings.LastIndex(owner.name, "-"); i > 0 && allDigits(owner.name[i+1:]) {
			return owner.name[:i], workloadapi.WorkloadType_CRONJOB
		}
		return owner.name, workloadapi.WorkloadType_JOB
	}
	return owner.name, workloadapi.WorkloadType_POD
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (t *translator) elideTD(td string) string {
	if td == DefaultTrustDomain {
		return ""
	}
	return td
}

func elideSA(sa string) string {
	if sa == "default" {
		return ""
	}
	return sa
}

func (t *translator) addWorkload(w *workloadapi.Workload) {
	t.addresses[w.Uid] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// workloadPolicies is the sorted union of selector AuthorizationPolicies
// and PeerAuthentication-derived policies for a workload.
func (t *translator) workloadPolicies(ns string, labels map[string]string) []string {
	out := append(t.selectorPoliciesFor(ns, labels), t.peerAuthnPolicies(ns, labels)...)
	sort.Strings(out)
	return out
}

// selectorPoliciesFor is policiesFor through the namespace index: the
// WORKLOAD_SELECTOR policy keys selecting labels in ns or in the root
// namespace, whose selector policies apply in every namespace (istiod's
// buildWorkloadPolicies).
func (t *translator) selectorPoliciesFor(ns string, labels map[string]string) []string {
	var out []string
	for _, p := range t.idx.policiesByNs[ns] {
		if subset(p.selector, labels) {
			out = append(out, p.key)
		}
	}
	if ns == t.cfg.RootNamespace {
		return out
	}
	for _, p := range t.idx.policiesByNs[t.cfg.RootNamespace] {
		if subset(p.selector, labels) {
			out = append(out, p.key)
		}
	}
	return out
}

// translatePod adds the pod's workload, if it has one (a finished pod or
// one without an IP has none).
func (t *translator) translatePod(p *corev1.Pod) {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return
	}
	ips := podIPs(p)
	if len(ips) == 0 {
		return // not scheduled / no sandbox yet: nothing can reach it
	}
	network := t.network(p.Labels, p.Namespace)
	wname, wtype := workloadNameAndType(p)
	cname, crev := canonical(p.Labels, wname)
	w := &workloadapi.Workload{
		Uid:               t.cfg.ClusterID + "//Pod/" + p.Namespace + "/" + p.Name,
		Name:              p.Name,
		Namespace:         p.Namespace,
		Network:           network,
		TrustDomain:       t.elideTD(t.cfg.TrustDomain),
		ServiceAccount:    elideSA(podServiceAccount(p)),
		Node:              p.Spec.NodeName,
		CanonicalName:     cname,
		CanonicalRevision: crev,
		WorkloadType:      wtype,
		WorkloadName:      wname,
		ClusterId:         t.cfg.ClusterID,
		Locality:          t.podLocality(p),
	}
	for _, ip := range ips {
		w.Addresses = append(w.Addresses, addrBytes(ip))
	}
	if p.Labels[LabelTunnel] == "http" {
		w.TunnelProtocol = workloadapi.TunnelProtocol_HBONE
		w.NativeTunnel = true
	} else if t.enrolled(p) {
		w.TunnelProtocol = workloadapi.TunnelProtocol_HBONE
	}
	if !podReady(p) {
		w.Status = workloadapi.WorkloadStatus_UNHEALTHY
	}
	if p.Spec.HostNetwork {
		w.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK
	}
	if gw, isWaypoint := p.Labels[LabelGatewayName]; !isWaypoint && p.Labels[LabelGatewayManaged] != ManagedMeshController {
		w.Waypoint = t.boundWaypoint("Pod", p.Namespace, p.Name, p.Labels, true)
	} else if wp := t.idx.waypoints[p.Namespace+"/"+gw]; wp != nil {
		w.ApplicationTunnel = wp.binding // a sandwiched waypoint's pod: its inbound binding
	}
	w.Services = t.podServices(p)
	w.AuthorizationPolicies = t.workloadPolicies(p.Namespace, p.Labels)
	t.addWorkload(w)
}

func podServiceAccount(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName != "" {
		return p.Spec.ServiceAccountName
	}
	if p.Spec.DeprecatedServiceAccount != "" {
		return p.Spec.DeprecatedServiceAccount
	}
	return "default"
}

// podLocality is istiod's: the pod's istio-locality label
// ("region.zone.subzone", the override istiod honours) wins; else the
// topology labels of the pod's Node (istiod's ambient rule: Kubernetes
// labels Nodes, not pods). Only for a pod whose Node is not in the set (a
// local-mode directory without Nodes, a pod not scheduled) are the pod's own
// topology labels read.
func (t *translator) podLocality(p *corev1.Pod) *workloadapi.Locality {
	if l := p.Labels[LabelLocality]; l != "" {
		return localityString(strings.ReplaceAll(l, ".", "/"))
	}
	if l, known := t.idx.nodes[p.Spec.NodeName]; known {
		return l
	}
	return locality(p.Labels)
}

func locality(labels map[string]string) *workloadapi.Locality {
	l := &workloadapi.Locality{Region: labels[LabelRegion], Zone: labels[LabelZone], Subzone: labels[LabelSubzone]}
	if l.Region == "" && l.Zone == "" && l.Subzone == "" {
		return nil
	}
	return l
}

func localityString(s string) *workloadapi.Locality {
	if s == "" {
		return nil
	}
	parts := strings.SplitN(s, "/", 3)
	l := &workloadapi.Locality{Region: parts[0]}
	if len(parts) > 1 {
		l.Zone = parts[1]
	}
	if len(parts) > 2 {
		l.Subzone = parts[2]
	}
	return l
}

// podServices: Services selecting the pod (ports resolved against its
// container ports; a named port the pod lacks is left out), ServiceEntries
// whose workloadSelector matches it, and selector-less Services whose
// EndpointSlices point at it.
func (t *translator) podServices(p *corev1.Pod) map[string]*workloadapi.PortList {
	out := map[string]*workloadapi.PortList{}
	t.idx.servicesSelecting(p.Namespace, p.Labels, func(s *corev1.Service) {
		pl := &workloadapi.PortList{}
		for _, sp := range tcpPorts(s) {
			if tp, ok := resolveTargetPort(sp, p); ok {
				pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: uint32(sp.Port), TargetPort: tp})
			}
		}
		out[s.Namespace+"/"+t.serviceHostname(s)] = pl
	})
	t.seSelectedServices(p.Namespace, p.Labels, nil, out)
	for k, pl := range t.sliceServicesForPod(p) {
		out[k] = pl
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// seSelectedServices adds the hosts of ServiceEntries in ns whose
// workloadSelector matches labels. wePorts are a WorkloadEntry's named port
// overrides (nil for pods).
func (t *translator) seSelectedServices(ns string, labels map[string]string, wePorts map[string]uint32, out map[string]*workloadapi.PortList) {
	for _, se := range t.idx.seSel[ns] {
		if !selects(se.Spec.WorkloadSelector.GetLabels(), labels) {
			continue
		}
		pl := sePorts(se, wePorts)
		for _, h := range se.Spec.Hosts {
			out[se.Namespace+"/"+h] = pl
		}
	}
}

// sePorts resolves ServiceEntry ports for one endpoint: the endpoint's
// named port, else the port's targetPort, else the port number.
func sePorts(se *networkingv1.ServiceEntry, epPorts map[string]uint32) *workloadapi.PortList {
	pl := &workloadapi.PortList{}
	for _, p := range se.Spec.Ports {
		if !tcpProtocol(p.Protocol) {
			continue
		}
		target := p.Number
		if v, ok := epPorts[p.Name]; ok && v != 0 {
			target = v
		} else if p.TargetPort != 0 {
			target = p.TargetPort
		}
		pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: p.Number, TargetPort: target})
	}
	return pl
}

func (t *translator) translateWorkloadEntries() {
	for _, we := range t.objs.WorkloadEntries {
		labels := map[string]string{}
		for k, v := range we.Labels {
			labels[k] = v
		}
		for k, v := range we.Spec.Labels {
			labels[k] = v
		}
		cname, crev := canonical(labels, we.Name)
		sa := we.Spec.ServiceAccount
		if sa == "" {
			sa = "default"
		}
		network := we.Spec.Network
		if network == "" {
			network = t.network(labels, we.Namespace)
		}
		w := &workloadapi.Workload{
			Uid:               t.cfg.ClusterID + "/networking.istio.io/WorkloadEntry/" + we.Namespace + "/" + we.Name,
			Name:              we.Name,
			Namespace:         we.Namespace,
			Network:           network,
			TrustDomain:       t.elideTD(t.cfg.TrustDomain),
			ServiceAccount:    elideSA(sa),
			CanonicalName:     cname,
			CanonicalRevision: crev,
			WorkloadType:      workloadapi.WorkloadType_POD,
			WorkloadName:      we.Name,
			ClusterId:         t.cfg.ClusterID,
			Locality:          localityString(we.Spec.Locality),
		}
		if !setAddress(w, we.Spec.Address) {
			t.warnf("WorkloadEntry", we.Namespace, we.Name, "no address; skipped")
			continue
		}
		if labels[LabelTunnel] == "http" || we.Annotations[AnnotationRedirection] == "enabled" {
			w.TunnelProtocol = workloadapi.TunnelProtocol_HBONE
		}
		w.Waypoint = t.boundWaypoint("WorkloadEntry", we.Namespace, we.Name, labels, true)
		svcs := map[string]*workloadapi.PortList{}
		t.idx.servicesSelecting(we.Namespace, labels, func(s *corev1.Service) {
			pl := &workloadapi.PortList{}
			for _, sp := range tcpPorts(s) {
				tp, ok := resolveTargetPort(sp, nil)
				if v, named := we.Spec.Ports[sp.TargetPort.StrVal]; sp.TargetPort.StrVal != "" && named {
					tp, ok = v, true
				}
				if ok {
					pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: uint32(sp.Port), TargetPort: tp})
				}
			}
			svcs[s.Namespace+"/"+t.serviceHostname(s)] = pl
		})
		t.seSelectedServices(we.Namespace, labels, we.Spec.Ports, svcs)
		if len(svcs) > 0 {
			w.Services = svcs
		}
		w.AuthorizationPolicies = t.workloadPolicies(we.Namespace, labels)
		t.addWorkload(w)
	}
}

// setAddress puts an IP into addresses or a DNS name into hostname.
func setAddress(w *workloadapi.Workload, addr string) bool {
	if addr == "" {
		return false
	}
	if ip, err := netip.ParseAddr(addr); err == nil {
		w.Addresses = [][]byte{addrBytes(ip)}
	} else {
		w.Hostname = addr
	}
	return true
}

// translateServiceEntryEndpoints: inline endpoints become workloads
// (uid .../ServiceEntry/<ns>/<name>/<address>). A DNS-resolved entry with
// neither endpoints nor workloadSelector gets one workload per
// non-wildcard host with hostname set (uid .../<ns>/<name>/<host>), so the
// node proxy resolves the host itself.
func (t *translator) translateServiceEntryEndpoints() {
	for _, se := range t.objs.ServiceEntries {
		hostsKeys := func(pl *workloadapi.PortList) map[string]*workloadapi.PortList {
			m := map[string]*workloadapi.PortList{}
			for _, h := range se.Spec.Hosts {
				m[se.Namespace+"/"+h] = pl
			}
			return m
		}
		base := func(suffix string, labels map[string]string, sa, network string) *workloadapi.Workload {
			if sa == "" {
				sa = "default"
			}
			if network == "" {
				network = t.network(labels, se.Namespace)
			}
			cname, crev := canonical(labels, se.Name)
			return &workloadapi.Workload{
				Uid:               t.cfg.ClusterID + "/networking.istio.io/ServiceEntry/" + se.Namespace + "/" + se.Name + "/" + suffix,
				Name:              se.Name,
				Namespace:         se.Namespace,
				Network:           network,
				TrustDomain:       t.elideTD(t.cfg.TrustDomain),
				ServiceAccount:    elideSA(sa),
				CanonicalName:     cname,
				CanonicalRevision: crev,
				WorkloadType:      workloadapi.WorkloadType_POD,
				WorkloadName:      se.Name,
				ClusterId:         t.cfg.ClusterID,
			}
		}
		if len(se.Spec.Endpoints) == 0 && se.Spec.WorkloadSelector == nil &&
			(se.Spec.Resolution == networkingv1alpha3.ServiceEntry_DNS || se.Spec.Resolution == networkingv1alpha3.ServiceEntry_DNS_ROUND_ROBIN) {
			for _, h := range se.Spec.Hosts {
				if strings.HasPrefix(h, "*") {
					continue
				}
				w := base(h, se.Labels, "", "")
				w.Hostname = h
				w.Services = map[string]*workloadapi.PortList{se.Namespace + "/" + h: sePorts(se, nil)}
				t.addWorkload(w)
			}
			continue
		}
		for _, ep := range se.Spec.Endpoints {
			labels := ep.Labels
			w := base(ep.Address, labels, ep.ServiceAccount, ep.Network)
			if !setAddress(w, ep.Address) {
				t.warnf("ServiceEntry", se.Namespace, se.Name, "endpoint without address skipped")
				continue
			}
			w.Locality = localityString(ep.Locality)
			if labels[LabelTunnel] == "http" {
				w.TunnelProtocol = workloadapi.TunnelProtocol_HBONE
			}
			w.Waypoint = t.boundWaypoint("ServiceEntry", se.Namespace, se.Name, se.Labels, true)
			w.Services = hostsKeys(sePorts(se, ep.Ports))
			w.AuthorizationPolicies = t.workloadPolicies(se.Namespace, labels)
			t.addWorkload(w)
		}
	}
}

// sliceServicesForPod: selector-less Services whose EndpointSlices name the
// pod as a targetRef.
func (t *translator) sliceServicesForPod(p *corev1.Pod) map[string]*workloadapi.PortList {
	refs := t.idx.podRefs[p.Namespace+"/"+p.Name]
	if len(refs) == 0 {
		return nil
	}
	var out map[string]*workloadapi.PortList
	// In slice order, so that of two slices of one Service the later wins,
	// as in a scan of the sorted slices.
	for _, key := range sortedKeys(refs) {
		es := refs[key]
		s := t.selectorlessService(es)
		if s == nil || !namesPod(es, p) {
			continue
		}
		if out == nil {
			out = map[string]*workloadapi.PortList{}
		}
		out[s.Namespace+"/"+t.serviceHostname(s)] = slicePorts(s, es)
	}
	return out
}

// namesPod reports whether an endpoint of es has the pod as its targetRef.
func namesPod(es *discoveryv1.EndpointSlice, p *corev1.Pod) bool {
	for _, e := range es.Endpoints {
		if r := e.TargetRef; r != nil && r.Kind == "Pod" && r.Name == p.Name && (r.Namespace == "" || r.Namespace == p.Namespace) {
			return true
		}
	}
	return false
}

func (t *translator) selectorlessService(es *discoveryv1.EndpointSlice) *corev1.Service {
	name := es.Labels[LabelServiceName]
	if name == "" {
		return nil
	}
	s := t.idx.svcByName[es.Namespace+"/"+name]
	if s == nil || len(s.Spec.Selector) > 0 {
		return nil // unknown, or the pods are the endpoints
	}
	return s
}

// slicePorts maps service ports to the slice's ports by name.
func slicePorts(s *corev1.Service, es *discoveryv1.EndpointSlice) *workloadapi.PortList {
	pl := &workloadapi.PortList{}
	for _, sp := range tcpPorts(s) {
		for _, ep := range es.Ports {
			name := ""
			if ep.Name != nil {
				name = *ep.Name
			}
			if name == sp.Name && ep.Port != nil && (ep.Protocol == nil || *ep.Protocol == corev1.ProtocolTCP) {
				pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: uint32(sp.Port), TargetPort: uint32(*ep.Port)})
				break
			}
		}
	}
	return pl
}

// translateEndpointSlices: endpoints of selector-less Services that are not
// pods become workloads (uid .../EndpointSlice/<ns>/<slice>/<first address>).
func (t *translator) translateEndpointSlice(es *discoveryv1.EndpointSlice) {
	s := t.selectorlessService(es)
	if s == nil {
		return
	}
	for _, e := range es.Endpoints {
		if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
			if _, known := t.idx.pods[es.Namespace+"/"+e.TargetRef.Name]; known {
				continue // the pod's own workload carries the service
			}
		}
		var ips []netip.Addr
		for _, a := range e.Addresses {
			if ip, err := netip.ParseAddr(a); err == nil {
				ips = append(ips, ip)
			}
		}
		if len(ips) == 0 {
			continue
		}
		w := &workloadapi.Workload{
			Uid:          t.cfg.ClusterID + "/discovery.k8s.io/EndpointSlice/" + es.Namespace + "/" + es.Name + "/" + ips[0].String(),
			Name:         es.Name,
			Namespace:    es.Namespace,
			Network:      t.network(nil, es.Namespace),
			WorkloadType: workloadapi.WorkloadType_POD,
			WorkloadName: es.Name,
			ClusterId:    t.cfg.ClusterID,
			Services:     map[string]*workloadapi.PortList{s.Namespace + "/" + t.serviceHostname(s): slicePorts(s, es)},
		}
		if e.NodeName != nil {
			w.Node = *e.NodeName
		}
		for _, ip := range ips {
			w.Addresses = append(w.Addresses, addrBytes(ip))
		}
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			w.Status = workloadapi.WorkloadStatus_UNHEALTHY
		}
		t.addWorkload(w)
	}
}
