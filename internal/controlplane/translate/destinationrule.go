package translate

import (
	"slices"
	"sort"
	"strings"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// DestinationRules at a waypoint: which rule applies to a backend host, its
// subsets resolved to workloads and its traffic policy (see the overview in
// virtualservice.go).

// destinationRuleFor is the DestinationRule that applies to host for a
// client (the waypoint) in namespace clientNs, or nil; a rule not exported
// to clientNs (exportTo) does not apply.
func (ir *istioRouting) destinationRuleFor(clientNs, host string) *networkingv1.DestinationRule {
	nsOrder := []string{clientNs, ir.t.hostNamespace(host, clientNs), ir.t.cfg.RootNamespace}
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
	d := ir.destinationRuleFor(clientNs, b.GetHostname())
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
	if out := trafficPolicy(tp, subTP, tpPath, subPath, &bad); out != nil {
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
	// The waypoint always reaches endpoints over HBONE (mTLS with the
	// mesh's identities): ISTIO_MUTUAL is what it does; other modes not.
	if tls := tp.GetTls(); tls != nil && tls.GetMode() != networkingv1alpha3.ClientTLSSettings_ISTIO_MUTUAL {
		bad.addf(path+".tls.mode", "%s: ztunnel-go's waypoint always uses HBONE mTLS (ISTIO_MUTUAL); requests to this destination answer 500", tls.GetMode())
	}
	for i, pl := range tp.GetPortLevelSettings() {
		pp := fieldAt(path+".portLevelSettings", i)
		if pl.GetPort().GetNumber() == 0 {
			bad.addf(pp+".port", "a port number is required; requests to this destination answer 500")
		}
		var e effectiveTP
		e.take(&networkingv1alpha3.TrafficPolicy{LoadBalancer: pl.GetLoadBalancer(), OutlierDetection: pl.GetOutlierDetection(),
			ConnectionPool: pl.GetConnectionPool()}, pp, true)
		convertEffective(&e, bad)
		if tls := pl.GetTls(); tls != nil && tls.GetMode() != networkingv1alpha3.ClientTLSSettings_ISTIO_MUTUAL {
			bad.addf(pp+".tls.mode", "%s: ztunnel-go's waypoint always uses HBONE mTLS (ISTIO_MUTUAL); requests to this destination answer 500", tls.GetMode())
		}
	}
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
		if p := ir.t.idx.pods[parts[3]+"/"+parts[4]]; p != nil {
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
