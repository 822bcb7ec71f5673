package translate

import (
	"slices"
	"strings"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// A DestinationRule traffic policy as the waypoint receives it: the
// subset's fields over the rule's, and for each port a portLevelSettings
// entry names, that port's policy merged as Istio's MergeTrafficPolicy
// does (a port-level entry replaces loadBalancer, connectionPool,
// outlierDetection and tls as a whole, set or not: "port level policies do
// not inherit").

// effectiveTP is one merged policy: each field and the path it came from.
type effectiveTP struct {
	lb             *networkingv1alpha3.LoadBalancerSettings
	od             *networkingv1alpha3.OutlierDetection
	cp             *networkingv1alpha3.ConnectionPoolSettings
	lbPath, odPath string
	cpPath         string
}

func (e *effectiveTP) take(tp *networkingv1alpha3.TrafficPolicy, path string, all bool) {
	if tp == nil {
		return
	}
	if all || tp.GetLoadBalancer() != nil {
		e.lb, e.lbPath = tp.GetLoadBalancer(), path+".loadBalancer"
	}
	if all || tp.GetOutlierDetection() != nil {
		e.od, e.odPath = tp.GetOutlierDetection(), path+".outlierDetection"
	}
	if all || tp.GetConnectionPool() != nil {
		e.cp, e.cpPath = tp.GetConnectionPool(), path+".connectionPool"
	}
}

// takePort applies tp's portLevelSettings entry for port, if any.
func (e *effectiveTP) takePort(tp *networkingv1alpha3.TrafficPolicy, path string, port uint32) {
	for i, pl := range tp.GetPortLevelSettings() {
		if pl.GetPort().GetNumber() == port {
			e.take(&networkingv1alpha3.TrafficPolicy{LoadBalancer: pl.GetLoadBalancer(), OutlierDetection: pl.GetOutlierDetection(),
				ConnectionPool: pl.GetConnectionPool()}, fieldAt(path+".portLevelSettings", i), true)
			return
		}
	}
}

// trafficPolicy converts the policy of a backend (tp, its subset's subTP;
// either may be nil) and returns nil when it sets nothing the waypoint acts
// on. Every field it cannot enforce is added to bad.
func trafficPolicy(tp, subTP *networkingv1alpha3.TrafficPolicy, tpPath, subPath string, bad *problems) *waypointapi.TrafficPolicy {
	var e effectiveTP
	e.take(tp, tpPath, false)
	e.take(subTP, subPath, false)
	out := convertEffective(&e, bad)
	unsupportedTP(tpPath, tp, bad)
	if subTP != nil {
		unsupportedTP(subPath, subTP, bad)
	}
	var ports []uint32
	for _, t := range []*networkingv1alpha3.TrafficPolicy{tp, subTP} {
		for _, pl := range t.GetPortLevelSettings() {
			if n := pl.GetPort().GetNumber(); n != 0 && !slices.Contains(ports, n) {
				ports = append(ports, n)
			}
		}
	}
	slices.Sort(ports)
	for _, port := range ports {
		var pe effectiveTP
		pe.take(tp, tpPath, false)
		pe.takePort(tp, tpPath, port)
		pe.take(subTP, subPath, false)
		pe.takePort(subTP, subPath, port)
		pp := convertEffective(&pe, bad)
		if pp == nil {
			pp = &waypointapi.TrafficPolicy{}
		}
		if out == nil {
			out = &waypointapi.TrafficPolicy{}
		}
		if out.PortPolicies == nil {
			out.PortPolicies = map[uint32]*waypointapi.TrafficPolicy{}
		}
		out.PortPolicies[port] = pp
	}
	return out
}

// convertEffective converts one merged policy; nil when it sets nothing.
func convertEffective(e *effectiveTP, bad *problems) *waypointapi.TrafficPolicy {
	out := &waypointapi.TrafficPolicy{
		LoadBalancer:     convertLB(e.lbPath, e.lb, bad),
		OutlierDetection: convertOutlier(e.odPath, e.od, bad),
		ConnectionPool:   convertPool(e.cpPath, e.cp, bad),
		ConsistentHash:   convertHash(e.lbPath+".consistentHash", e.lb.GetConsistentHash(), bad),
	}
	out.Locality = convertLocality(e.lbPath+".localityLbSetting", e.lb.GetLocalityLbSetting(), e.od != nil, bad)
	if out.LoadBalancer == waypointapi.LoadBalancer_LB_DEFAULT && out.OutlierDetection == nil && out.ConnectionPool == nil &&
		out.ConsistentHash == nil && out.Locality == nil {
		return nil
	}
	return out
}

func clampU32(v int32) uint32 { return uint32(max(v, 0)) }

// convertPool is connectionPool as Istio maps it onto Envoy's circuit
// breakers: a limit of 0 (unset) is no limit (Istio's defaults are 2^32-1).
func convertPool(path string, cp *networkingv1alpha3.ConnectionPoolSettings, bad *problems) *waypointapi.ConnectionPool {
	if cp == nil {
		return nil
	}
	out := &waypointapi.ConnectionPool{}
	if tcp := cp.GetTcp(); tcp != nil {
		out.MaxConnections = clampU32(tcp.GetMaxConnections())
		if ms, ok := durationMs(tcp.GetConnectTimeout()); ok {
			out.ConnectTimeoutMs = max(ms, 1)
		}
		unsupported := func(field string, set bool) {
			if set {
				bad.addf(path+".tcp."+field, "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
			}
		}
		unsupported("tcpKeepalive", tcp.GetTcpKeepalive() != nil)
		unsupported("maxConnectionDuration", tcp.GetMaxConnectionDuration() != nil)
		unsupported("idleTimeout", tcp.GetIdleTimeout() != nil)
	}
	if h := cp.GetHttp(); h != nil {
		out.MaxPendingRequests = clampU32(h.GetHttp1MaxPendingRequests())
		out.MaxRequests = clampU32(h.GetHttp2MaxRequests())
		out.MaxRequestsPerConnection = clampU32(h.GetMaxRequestsPerConnection())
		out.MaxRetries = clampU32(h.GetMaxRetries())
		if ms, ok := durationMs(h.GetIdleTimeout()); ok {
			out.IdleTimeoutMs = max(ms, 1)
		}
		unsupported := func(field string, set bool) {
			if set {
				bad.addf(path+".http."+field, "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
			}
		}
		unsupported("h2UpgradePolicy", h.GetH2UpgradePolicy() != networkingv1alpha3.ConnectionPoolSettings_HTTPSettings_DEFAULT)
		unsupported("useClientProtocol", h.GetUseClientProtocol())
		unsupported("maxConcurrentStreams", h.GetMaxConcurrentStreams() != 0)
		unsupported("http2KeepAlive", h.GetHttp2KeepAlive() != nil)
	}
	return out
}

// Envoy's consistent hash table sizes: Maglev's default (a prime), the
// ring's default minimum and Envoy's largest ring.
const (
	defaultMaglevSize = 65537
	defaultRingSize   = 1024
	maxRingSize       = 8 << 20
)

func convertHash(path string, ch *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB, bad *problems) *waypointapi.ConsistentHash {
	if ch == nil {
		return nil
	}
	out := &waypointapi.ConsistentHash{TableSize: defaultRingSize}
	switch k := ch.GetHashKey().(type) {
	case *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		out.Key, out.Name = waypointapi.ConsistentHash_HEADER, k.HttpHeaderName
	case *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		c := k.HttpCookie
		out.Key, out.Name, out.CookiePath = waypointapi.ConsistentHash_COOKIE, c.GetName(), c.GetPath()
		if c.GetTtl() != nil {
			out.CookieTtlSet = true
			out.CookieTtlMs = uint64(max(c.GetTtl().AsDuration().Milliseconds(), 0))
		}
		if len(c.GetAttributes()) > 0 {
			bad.addf(path+".httpCookie.attributes", "not supported by ztunnel-go's waypoint; requests to this destination answer 500")
		}
		if c.GetName() == "" {
			bad.addf(path+".httpCookie.name", "required; requests to this destination answer 500")
		}
	case *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		out.Key = waypointapi.ConsistentHash_SOURCE_IP
		if !k.UseSourceIp {
			bad.addf(path+".useSourceIp", "false names no hash key; requests to this destination answer 500")
		}
	case *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		out.Key, out.Name = waypointapi.ConsistentHash_QUERY_PARAMETER, k.HttpQueryParameterName
	default:
		bad.addf(path, "no hash key (httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName); requests to this destination answer 500")
	}
	if (out.Key == waypointapi.ConsistentHash_HEADER || out.Key == waypointapi.ConsistentHash_QUERY_PARAMETER) && out.Name == "" {
		bad.addf(path, "the hash key's name is empty; requests to this destination answer 500")
	}
	if n := ch.GetMinimumRingSize(); n > 0 {
		out.TableSize = n
	}
	switch a := ch.GetHashAlgorithm().(type) {
	case *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB_RingHash_:
		if n := a.RingHash.GetMinimumRingSize(); n > 0 {
			out.TableSize = n
		}
	case *networkingv1alpha3.LoadBalancerSettings_ConsistentHashLB_Maglev:
		out.Maglev, out.TableSize = true, defaultMaglevSize
		if n := a.Maglev.GetTableSize(); n > 0 {
			if !prime(n) || n > maxRingSize {
				bad.addf(path+".maglev.tableSize", "%d is not a prime up to %d, as Envoy requires; requests to this destination answer 500", n, maxRingSize)
			}
			out.TableSize = n
		}
	}
	if out.TableSize > maxRingSize {
		bad.addf(path+".ringHash.minimumRingSize", "%d is larger than Envoy's maximum ring (%d); requests to this destination answer 500", out.TableSize, maxRingSize)
	}
	return out
}

func prime(n uint64) bool {
	if n < 2 {
		return false
	}
	for d := uint64(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// priorityLabels are the failoverPriority labels the waypoint can compare:
// those the workload API carries for the waypoint and every endpoint.
var priorityLabels = []string{"topology.istio.io/network", "topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"}

// convertLocality is localityLbSetting as Istio applies it
// (ApplyLocalityLoadBalancer): enabled false turns it off; distribute
// applies on its own; failover and failoverPriority only with outlier
// detection ("otherwise Envoy will never drop down to a lower priority"),
// and then also without a localityLbSetting (the mesh's default is enabled).
func convertLocality(path string, l *networkingv1alpha3.LocalityLoadBalancerSetting, outlier bool, bad *problems) *waypointapi.LocalityLb {
	if l.GetEnabled() != nil && !l.GetEnabled().GetValue() {
		return nil
	}
	out := &waypointapi.LocalityLb{}
	for i, d := range l.GetDistribute() {
		out.Distribute = append(out.Distribute, &waypointapi.LocalityDistribute{From: d.GetFrom(), To: d.GetTo()})
		if d.GetFrom() == "" || len(d.GetTo()) == 0 {
			bad.addf(fieldAt(path+".distribute", i), "from and to are required; requests to this destination answer 500")
		}
	}
	if len(l.GetDistribute()) > 0 && (len(l.GetFailover()) > 0 || len(l.GetFailoverPriority()) > 0) {
		bad.addf(path, "distribute and failover are exclusive (Istio's validation); requests to this destination answer 500")
	}
	if len(out.Distribute) > 0 {
		return out
	}
	if !outlier {
		return nil
	}
	for _, f := range l.GetFailover() {
		out.Failover = append(out.Failover, &waypointapi.LocalityFailover{From: f.GetFrom(), To: f.GetTo()})
	}
	for i, lbl := range l.GetFailoverPriority() {
		if !slices.Contains(priorityLabels, lbl) {
			bad.addf(fieldAt(path+".failoverPriority", i), "%q: ztunnel-go's waypoint compares only %s; requests to this destination answer 500",
				lbl, strings.Join(priorityLabels, ", "))
		}
		out.FailoverPriority = append(out.FailoverPriority, lbl)
	}
	if len(out.FailoverPriority) > 0 && len(out.Failover) > 0 {
		bad.addf(path+".failover", "with failoverPriority: not supported by ztunnel-go's waypoint; requests to this destination answer 500")
	}
	return out
}
