package translate

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestDestinationRuleTrafficPolicy: connectionPool, consistentHash,
// localityLbSetting and portLevelSettings reach the waypoint as Istio
// defines them: limits as given (unset: none), the hash key and table,
// locality failover only with outlier detection, and a port-level entry
// replacing the four fields it holds for its port (set or not).
func TestDestinationRuleTrafficPolicy(t *testing.T) {
	c, sts := bookinfoConfig(t, `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings
  trafficPolicy:
    connectionPool:
      tcp: {maxConnections: 2, connectTimeout: 250ms}
      http: {http1MaxPendingRequests: 3, http2MaxRequests: 4, maxRequestsPerConnection: 5, maxRetries: 6, idleTimeout: 7s}
    loadBalancer:
      consistentHash: {httpCookie: {name: user, path: /, ttl: 60s}, maglev: {tableSize: 131}}
      localityLbSetting: {failover: [{from: us-east, to: eu-west}]}
    outlierDetection: {consecutive5xxErrors: 1}
    portLevelSettings:
    - port: {number: 9080}
      loadBalancer: {consistentHash: {httpHeaderName: x-user}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer:
      localityLbSetting: {distribute: [{from: "us-east/*", to: {"us-east/*": 80, "eu-west/*": 20}}]}
    connectionPool: {http: {maxConcurrentStreams: 10}}
`)
	top := &waypointapi.TrafficPolicy{
		ConnectionPool: &waypointapi.ConnectionPool{MaxConnections: 2, ConnectTimeoutMs: 250, MaxPendingRequests: 3, MaxRequests: 4,
			MaxRequestsPerConnection: 5, MaxRetries: 6, IdleTimeoutMs: 7000},
		ConsistentHash: &waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_COOKIE, Name: "user", CookiePath: "/",
			CookieTtlSet: true, CookieTtlMs: 60000, Maglev: true, TableSize: 131},
		Locality: &waypointapi.LocalityLb{Failover: []*waypointapi.LocalityFailover{{From: "us-east", To: "eu-west"}}},
		OutlierDetection: &waypointapi.OutlierDetection{ConsecutiveServerErrors: 1, IntervalMs: 10000, BaseEjectionTimeMs: 30000,
			MaxEjectionPercent: 10},
	}
	// Port 9080: its own loadBalancer, and no connectionPool or
	// outlierDetection (not inherited), so no locality failover either.
	top.PortPolicies = map[uint32]*waypointapi.TrafficPolicy{9080: {
		ConsistentHash: &waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_HEADER, Name: "x-user", TableSize: 1024},
	}}
	if tp := serviceRoutes(t, c, "ratings")[0].GetRules()[0].GetBackends()[0].GetTrafficPolicy(); !proto.Equal(tp, top) {
		t.Errorf("ratings policy\n%v\nwant\n%v", tp, top)
	}
	details := &waypointapi.TrafficPolicy{
		ConsistentHash: &waypointapi.ConsistentHash{Key: waypointapi.ConsistentHash_SOURCE_IP, TableSize: 2048},
	}
	c2, _ := bookinfoConfig(t, `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings
  trafficPolicy:
    loadBalancer:
      consistentHash: {useSourceIp: true, ringHash: {minimumRingSize: 2048}}
      localityLbSetting: {failover: [{from: us-east, to: eu-west}]}
`)
	if tp := serviceRoutes(t, c2, "ratings")[0].GetRules()[0].GetBackends()[0].GetTrafficPolicy(); !proto.Equal(tp, details) {
		t.Errorf("details policy (failover without outlierDetection does nothing, as in Istio)\n%v\nwant\n%v", tp, details)
	}
	if st := statusOf(sts, "DestinationRule", "default/ratings"); len(st.Invalid) != 0 {
		t.Errorf("ratings status %+v", st)
	}
	if r := serviceRoutes(t, c, "reviews"); len(r) != 1 || r[0].GetRules()[0].GetBackends() != nil {
		t.Errorf("reviews routes %v: an unenforceable policy must answer 500", r)
	}
	if st := statusOf(sts, "DestinationRule", "default/reviews"); len(st.Invalid) != 1 ||
		!strings.HasPrefix(st.Invalid[0], "spec.trafficPolicy.connectionPool.http.maxConcurrentStreams: ") {
		t.Errorf("reviews status %+v", st)
	}
}

// TestDestinationRuleRefusals: what the waypoint cannot enforce of these
// fields is named in the status.
func TestDestinationRuleRefusals(t *testing.T) {
	for _, tc := range []struct{ tp, want string }{
		{`{loadBalancer: {consistentHash: {maglev: {tableSize: 100}, httpHeaderName: x}}}`, "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize"},
		{`{loadBalancer: {consistentHash: {httpCookie: {name: c, attributes: [{name: SameSite, value: Strict}]}}}}`, "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.attributes"},
		{`{outlierDetection: {}, loadBalancer: {localityLbSetting: {failoverPriority: [app]}}}`, "spec.trafficPolicy.loadBalancer.localityLbSetting.failoverPriority[0]"},
		{`{loadBalancer: {localityLbSetting: {distribute: [{from: a, to: {b: 100}}], failover: [{from: a, to: b}]}}}`, "spec.trafficPolicy.loadBalancer.localityLbSetting"},
		{`{connectionPool: {tcp: {maxConnectionDuration: 1s}}}`, "spec.trafficPolicy.connectionPool.tcp.maxConnectionDuration"},
		{`{portLevelSettings: [{port: {number: 80}, connectionPool: {http: {h2UpgradePolicy: UPGRADE}}}]}`, "spec.trafficPolicy.portLevelSettings[0].connectionPool.http.h2UpgradePolicy"},
	} {
		_, sts := bookinfoConfig(t, `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec: {host: ratings, trafficPolicy: `+tc.tp+`}
`)
		st := statusOf(sts, "DestinationRule", "default/ratings")
		if len(st.Invalid) != 1 || !strings.HasPrefix(st.Invalid[0], tc.want+": ") {
			t.Errorf("%s: status %+v, want %s", tc.tp, st.Invalid, tc.want)
		}
	}
}
