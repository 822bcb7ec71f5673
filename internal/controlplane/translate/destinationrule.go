package translate

import (
	"slices"
	"sort"
	"strings"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// DestinationRules at a waypoint: which rule applies to a backend host, its
// subsets resolved to workloads and its traffic policy (see the overview in
// virtualservice.go).

// destinationRuleFor is the DestinationRule that applies to host for a
// client (the waypoint) in namespace clientNs, or nil; a rule not exported
// to clientNs (exportTo) does not apply. svcNs is the namespace of the
// service of that host (a ServiceEntry's: its hostname names none); "":
// the one a Kubernetes hostname names.
func (ir *istioRouting) destinationRuleFor(clientNs, svcNs, host string) *networkingv1.DestinationRule {
	if svcNs == "" {
		svcNs = ir.t.hostNamespace(host, clientNs)
	}
	nsOrder := []string{clientNs, svcNs, ir.t.cfg.RootNamespace}
	for _, ns := range nsOrder {
		var exact, wild []*networkingv1.DestinationRule
		for _, d := range ir.t.objs.DestinationRules {
			if d.Namespace != ns || d.Spec.GetWorkloadSelector() != nil {
				continue
			}
			if e, _ := parseExportTo(d.Spec.GetExportTo(), ir.t.cfg.DefaultDestinationRuleExportTo, d.Namespace, "spec.exportTo"); !e.visibleTo(clientNs) {
				continue
			}
			p := ir.t.resolveIstioHost(d.Spec.GetHost(), d.Namespace)
			switch {
			case p == host:
				exact = append(exact, d)
			case hostMatches(p, host):
				wild = append(wild, d)
			}
		}
		for _, set := range [][]*networkingv1.DestinationRule{exact, wild} {
			if len(set) > 0 {
				sort.SliceStable(set, func(i, j int) bool { return olderMeta(&set[i].ObjectMeta, &set[j].ObjectMeta) })
				return set[0]
			}
		}
	}
	return nil
}

// applyDR fills b's subset and traffic policy from its DestinationRule. It
// returns false when the policy holds a field the waypoint cannot enforce.
func (ir *istioRouting) applyDR(clientNs, wp, svcKey string, b *waypointapi.Backend) bool {
	if b == nil {
		return true
	}
	d := ir.destinationRuleFor(clientNs, b.GetNamespace(), b.GetHostname())
	if d == nil {
		if b.Subset != "" {
			b.MissingSubset = true
		}
		return true
	}
	st := ir.dr[d.Namespace+"/"+d.Name]
	st.attach(wp, svcKey)
	tp, tpPath := d.Spec.GetTrafficPolicy(), "spec.trafficPolicy"
	var subTP *networkingv1alpha3.TrafficPolicy
	subPath := ""
	if b.Subset != "" {
		i := slices.IndexFunc(d.Spec.GetSubsets(), func(s *networkingv1alpha3.Subset) bool { return s.GetName() == b.Subset })
		if i < 0 {
			b.MissingSubset = true
			return true
		}
		sub := d.Spec.GetSubsets()[i]
		b.SubsetLabels = sub.GetLabels()
		b.SubsetWorkloads = ir.subsetWorkloads(b.GetNamespace()+"/"+b.GetHostname(), sub.GetLabels())
		subTP, subPath = sub.GetTrafficPolicy(), fieldAt("spec.subsets", i)+".trafficPolicy"
	}
	var bad problems
	out := trafficPolicy(tp, subTP, tpPath, subPath, &bad)
	// tls is per backend port (a route backend names its port), where the
	// other settings go per port in out.PortPolicies.
	tls, tlsPath := portTLS(tpPath, tp, b.GetPort())
	if st, sp := portTLS(subPath, subTP, b.GetPort()); st != nil {
		tls, tlsPath = st, sp
	}
	if b.GetPort() == 0 && (hasPortTLS(tp) || hasPortTLS(subTP)) {
		bad.addf(tpPath+".portLevelSettings", "tls per port needs the destination's port (a route backend without one); requests to this destination answer 500")
	}
	if t := ir.convertTLS(tlsPath, tls, d.Namespace, &bad); t != nil {
		if out == nil {
			out = &waypointapi.TrafficPolicy{}
		}
		out.Tls = t
	}
	if out != nil {
		b.TrafficPolicy = out
	}
	for _, p := range bad {
		st.addInvalid(p)
	}
	return len(bad) == 0
}

func convertLB(path string, lb *networkingv1alpha3.LoadBalancerSettings, bad *problems) waypointapi.LoadBalancer {
	if lb == nil {
		return waypointapi.LoadBalancer_LB_DEFAULT
	}
	if lb.GetWarmupDurationSecs() != nil {
		bad.addf(path+".warmupDurationSecs", "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
	}
	if lb.GetWarmup() != nil {
		bad.addf(path+".warmup", "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
	}
	switch p := lb.GetLbPolicy().(type) {
	case nil, *networkingv1alpha3.LoadBalancerSettings_ConsistentHash:
		return waypointapi.LoadBalancer_LB_DEFAULT // consistentHash: convertHash
	case *networkingv1alpha3.LoadBalancerSettings_Simple:
		switch p.Simple {
		case networkingv1alpha3.LoadBalancerSettings_UNSPECIFIED:
			return waypointapi.LoadBalancer_LB_DEFAULT
		case networkingv1alpha3.LoadBalancerSettings_ROUND_ROBIN:
			return waypointapi.LoadBalancer_ROUND_ROBIN
		case networkingv1alpha3.LoadBalancerSettings_RANDOM:
			return waypointapi.LoadBalancer_RANDOM
		case networkingv1alpha3.LoadBalancerSettings_LEAST_REQUEST, networkingv1alpha3.LoadBalancerSettings_LEAST_CONN:
			return waypointapi.LoadBalancer_LEAST_REQUEST
		}
		bad.addf(path+".simple", "%s is not supported by ztunnel-go's waypoint; requests to this destination answer 500", p.Simple)
	default:
		bad.addf(path, "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
	}
	return waypointapi.LoadBalancer_LB_DEFAULT
}

// Istio's (Envoy's) outlier detection defaults.
const (
	defaultConsecutive5xx     = 5
	defaultOutlierIntervalMs  = 10_000
	defaultBaseEjectionMs     = 30_000
	defaultMaxEjectionPercent = 10
)

func convertOutlier(path string, od *networkingv1alpha3.OutlierDetection, bad *problems) *waypointapi.OutlierDetection {
	if od == nil {
		return nil
	}
	out := &waypointapi.OutlierDetection{
		ConsecutiveServerErrors: defaultConsecutive5xx, IntervalMs: defaultOutlierIntervalMs,
		BaseEjectionTimeMs: defaultBaseEjectionMs, MaxEjectionPercent: defaultMaxEjectionPercent,
	}
	if v := od.GetConsecutive_5XxErrors(); v != nil {
		out.ConsecutiveServerErrors = v.GetValue()
	}
	if v := od.GetConsecutiveGatewayErrors(); v != nil {
		out.ConsecutiveGatewayErrors = v.GetValue()
	} else if od.GetConsecutiveErrors() > 0 { // deprecated: 502, 503, 504
		out.ConsecutiveGatewayErrors = uint32(od.GetConsecutiveErrors())
	}
	if ms, ok := durationMs(od.GetInterval()); ok {
		out.IntervalMs = ms
	}
	if ms, ok := durationMs(od.GetBaseEjectionTime()); ok {
		out.BaseEjectionTimeMs = ms
	}
	if p := od.GetMaxEjectionPercent(); p > 0 {
		out.MaxEjectionPercent = uint32(min(p, 100))
	}
	unsupported := func(field string, set bool) {
		if set {
			bad.addf(path+"."+field, "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
		}
	}
	unsupported("splitExternalLocalOriginErrors", od.GetSplitExternalLocalOriginErrors())
	unsupported("consecutiveLocalOriginFailures", od.GetConsecutiveLocalOriginFailures() != nil)
	unsupported("minHealthPercent", od.GetMinHealthPercent() > 0)
	unsupported("outlierDetectionHttpErrorCodes", len(od.GetOutlierDetectionHttpErrorCodes()) > 0)
	unsupported("failurePercentageThreshold", od.GetFailurePercentageThreshold() != nil)
	return out
}

func unsupportedTP(path string, tp *networkingv1alpha3.TrafficPolicy, bad *problems) {
	if tp == nil {
		return
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"tunnel", tp.GetTunnel() != nil},
		{"proxyProtocol", tp.GetProxyProtocol() != nil},
		{"retryBudget", tp.GetRetryBudget() != nil},
	} {
		if f.set {
			bad.addf(path+"."+f.name, "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
		}
	}
	checkTLS(path+".tls", tp.GetTls(), bad)
	// portLevelSettings: each entry's settings are checked as the whole
	// policy's are (trafficPolicy merges them per port; tls, per backend
	// port, see portTLS).
	for i, pl := range tp.GetPortLevelSettings() {
		pp := fieldAt(path+".portLevelSettings", i)
		if pl.GetPort().GetNumber() == 0 {
			bad.addf(pp+".port", "a port number is required; requests to this destination answer 500")
		}
		var e effectiveTP
		e.take(&networkingv1alpha3.TrafficPolicy{LoadBalancer: pl.GetLoadBalancer(), OutlierDetection: pl.GetOutlierDetection(),
			ConnectionPool: pl.GetConnectionPool()}, pp, true)
		convertEffective(&e, bad)
		checkTLS(pp+".tls", pl.GetTls(), bad)
	}
}

// portTLS is the tls of tp for service port port: its portLevelSettings
// entry's when that has one, else tp's own (Istio's precedence), with its
// field path.
func portTLS(path string, tp *networkingv1alpha3.TrafficPolicy, port uint32) (*networkingv1alpha3.ClientTLSSettings, string) {
	for i, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port && port != 0 && pl.GetTls() != nil {
			return pl.GetTls(), fieldAt(path+".portLevelSettings", i) + ".tls"
		}
	}
	return tp.GetTls(), path + ".tls"
}

// hasPortTLS: some portLevelSettings entry of tp sets tls.
func hasPortTLS(tp *networkingv1alpha3.TrafficPolicy) bool {
	return slices.ContainsFunc(tp.GetPortLevelSettings(), func(pl *networkingv1alpha3.TrafficPolicy_PortTrafficPolicy) bool {
		return pl.GetTls() != nil
	})
}

// checkTLS lists what the waypoint cannot do of a ClientTLSSettings. It
// reaches mesh endpoints over HBONE (mTLS with the mesh's identities):
// ISTIO_MUTUAL is what it does anyway; SIMPLE and MUTUAL it originates
// (convertTLS), with certificates only from a Secret (credentialName): its
// pod has no files of the user's.
func checkTLS(path string, tls *networkingv1alpha3.ClientTLSSettings, bad *problems) {
	if tls == nil {
		return
	}
	const answers = "; requests to this destination answer 500"
	switch tls.GetMode() {
	case networkingv1alpha3.ClientTLSSettings_ISTIO_MUTUAL:
		return
	case networkingv1alpha3.ClientTLSSettings_SIMPLE, networkingv1alpha3.ClientTLSSettings_MUTUAL:
	default:
		bad.addf(path+".mode", "%s: ztunnel-go's waypoint always uses HBONE mTLS (ISTIO_MUTUAL) or originates TLS (SIMPLE, MUTUAL)"+answers, tls.GetMode())
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"clientCertificate", tls.GetClientCertificate() != ""},
		{"privateKey", tls.GetPrivateKey() != ""},
		{"caCertificates", tls.GetCaCertificates() != ""},
		{"caCrl", tls.GetCaCrl() != ""},
	} {
		if f.set {
			bad.addf(path+"."+f.name, "a file path is not available to ztunnel-go's waypoint: give the certificates in a Secret named by credentialName"+answers)
		}
	}
	if tls.GetMode() == networkingv1alpha3.ClientTLSSettings_MUTUAL && tls.GetCredentialName() == "" {
		bad.addf(path+".credentialName", "MUTUAL needs the client certificate from a Secret named by credentialName"+answers)
	}
}

// convertTLS is the TLS the waypoint originates for tls (SIMPLE or MUTUAL),
// with the certificates of the Secret credentialName names in ns, the
// DestinationRule's own namespace (never another: a rule must not read a
// Secret of a namespace its author may not). nil: none to originate, or
// what checkTLS (called by unsupportedTP) refuses.
func (ir *istioRouting) convertTLS(path string, tls *networkingv1alpha3.ClientTLSSettings, ns string, bad *problems) *waypointapi.ClientTLS {
	mode := tls.GetMode()
	if mode != networkingv1alpha3.ClientTLSSettings_SIMPLE && mode != networkingv1alpha3.ClientTLSSettings_MUTUAL {
		return nil
	}
	out := &waypointapi.ClientTLS{
		Mutual: mode == networkingv1alpha3.ClientTLSSettings_MUTUAL, Sni: tls.GetSni(),
		SubjectAltNames: tls.GetSubjectAltNames(), InsecureSkipVerify: tls.GetInsecureSkipVerify().GetValue(),
	}
	name := tls.GetCredentialName()
	if name == "" {
		return out
	}
	out.Credential = ns + "/" + name
	var sec *corev1.Secret
	for _, s := range ir.t.objs.Secrets {
		if s.Namespace == ns && s.Name == name {
			sec = s
			break
		}
	}
	const answers = "; requests to this destination answer 500"
	if sec == nil {
		bad.addf(path+".credentialName", "Secret %s/%s not found (only the DestinationRule's own namespace is read)"+answers, ns, name)
		return nil
	}
	pick := func(keys ...string) []byte {
		for _, k := range keys {
			if v := sec.Data[k]; len(v) > 0 {
				return v
			}
		}
		return nil
	}
	out.CaCertificates = pick("ca.crt", "cacert")
	if out.Mutual {
		out.CertChain, out.PrivateKey = pick("tls.crt", "cert"), pick("tls.key", "key")
		if len(out.CertChain) == 0 || len(out.PrivateKey) == 0 {
			bad.addf(path+".credentialName", "Secret %s/%s has no client certificate and key (tls.crt and tls.key, or cert and key)"+answers, ns, name)
			return nil
		}
	}
	return out
}

// subsetWorkloads returns the uids of the service's workloads (svcKey
// "ns/hostname") whose labels (a pod's, a WorkloadEntry's) match sel.
// validateDR lists every field of d the waypoint cannot enforce, in the
// top-level traffic policy and in every subset's, whether or not a route
// uses it yet: the status names them from the start, and a later route to
// the subset fails closed on the same fields in applyDR.
func validateDR(d *networkingv1.DestinationRule) problems {
	var bad problems
	if d.Spec.GetWorkloadSelector() != nil {
		bad.addf("spec.workloadSelector", "not supported by ztunnel-go's waypoint: a DestinationRule with a workload selector applies to no waypoint")
	}
	check := func(path string, tp *networkingv1alpha3.TrafficPolicy) {
		if tp == nil {
			return
		}
		trafficPolicy(tp, nil, path, "", &bad)
	}
	check("spec.trafficPolicy", d.Spec.GetTrafficPolicy())
	for i, sub := range d.Spec.GetSubsets() {
		check(fieldAt("spec.subsets", i)+".trafficPolicy", sub.GetTrafficPolicy())
	}
	_, exp := parseExportTo(d.Spec.GetExportTo(), nil, d.Namespace, "spec.exportTo")
	return append(bad, exp...)
}

func (ir *istioRouting) subsetWorkloads(svcKey string, sel map[string]string) []string {
	if ir.endpoints == nil {
		ir.endpoints = map[string][]*workloadapi.Workload{}
		for _, a := range ir.res.Addresses.All() {
			if w := a.GetWorkload(); w != nil {
				for k := range w.GetServices() {
					ir.endpoints[k] = append(ir.endpoints[k], w)
				}
			}
		}
	}
	selector := labels.SelectorFromSet(sel)
	var out []string
	for _, w := range ir.endpoints[svcKey] {
		if l, ok := ir.workloadLabels(w); ok && selector.Matches(labels.Set(l)) {
			out = append(out, w.GetUid())
		}
	}
	sort.Strings(out)
	return out
}

// workloadLabels finds the labels of a workload by its uid
// ("<cluster>/<group>/<Kind>/<ns>/<name>[/...]").
func (ir *istioRouting) workloadLabels(w *workloadapi.Workload) (map[string]string, bool) {
	parts := strings.SplitN(w.GetUid(), "/", 6)
	if len(parts) < 5 {
		return nil, false
	}
	switch parts[2] {
	case "Pod":
		if ir.pods == nil {
			ir.pods = make(map[string]*corev1.Pod, len(ir.t.objs.Pods))
			for _, p := range ir.t.objs.Pods {
				ir.pods[p.Namespace+"/"+p.Name] = p
			}
		}
		if p := ir.pods[parts[3]+"/"+parts[4]]; p != nil {
			return p.Labels, true
		}
	case "WorkloadEntry":
		for _, we := range ir.t.objs.WorkloadEntries {
			if we.Namespace == parts[3] && we.Name == parts[4] {
				l := map[string]string{}
				for k, v := range we.Labels {
					l[k] = v
				}
				for k, v := range we.Spec.GetLabels() {
					l[k] = v
				}
				return l, true
			}
		}
	}
	return nil, false
}
