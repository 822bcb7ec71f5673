package translate

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestWaypointDestinationRuleTLS: tls SIMPLE and MUTUAL become TLS the
// waypoint originates, with the certificates of the Secret credentialName
// names in the DestinationRule's own namespace (in either of Istio's
// formats); a Secret of the same name in another namespace is never read,
// and what cannot be built (file paths, DISABLE, MUTUAL without a client
// certificate) is refused with status and answers 500.
func TestWaypointDestinationRuleTLS(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	c, sts := bookinfoConfig(t, `---
apiVersion: v1
kind: Secret
metadata: {name: ratings-ca, namespace: default}
data: {cacert: `+b64("CA PEM")+`}
---
apiVersion: v1
kind: Secret
metadata: {name: client, namespace: other}
type: kubernetes.io/tls
data: {tls.crt: `+b64("CERT")+`, tls.key: `+b64("KEY")+`}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings.default.svc.cluster.local
  trafficPolicy:
    tls: {mode: SIMPLE, sni: ratings.example, subjectAltNames: [ratings.example], credentialName: ratings-ca}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    tls: {mode: MUTUAL, credentialName: client, caCertificates: /etc/ca.pem}
`)
	r := serviceRoutes(t, c, "ratings")
	if len(r) != 1 || len(r[0].GetRules()[0].GetBackends()) != 1 {
		t.Fatalf("ratings routes %v", r)
	}
	got := r[0].GetRules()[0].GetBackends()[0].GetTrafficPolicy().GetTls()
	if got == nil || got.GetMutual() || got.GetSni() != "ratings.example" || strings.Join(got.GetSubjectAltNames(), ",") != "ratings.example" ||
		string(got.GetCaCertificates()) != "CA PEM" || got.GetCredential() != "default/ratings-ca" || got.GetCertChain() != nil {
		t.Errorf("ratings tls = %v", got)
	}
	if st := statusOf(sts, "DestinationRule", "default/ratings"); len(st.Invalid) != 0 {
		t.Errorf("ratings status %+v", st)
	}
	r = serviceRoutes(t, c, "reviews")
	if len(r) != 1 || r[0].GetRules()[0].GetBackends() != nil {
		t.Fatalf("reviews routes %v: an unenforceable tls must answer 500", r)
	}
	st := statusOf(sts, "DestinationRule", "default/reviews")
	joined := strings.Join(st.Invalid, "\n")
	if !strings.Contains(joined, "spec.trafficPolicy.tls.caCertificates: ") || !strings.Contains(joined, "Secret default/client not found") {
		t.Errorf("reviews status %+v: want the file path refused and the Secret of namespace other not read", st)
	}
}

// TestWaypointDestinationRulePortTLS: portLevelSettings[].tls applies to
// its port (the DestinationRule's catch-all becomes one route per service
// port); its other fields are checked as the whole policy's are.
func TestWaypointDestinationRulePortTLS(t *testing.T) {
	c, sts := bookinfoConfig(t, `---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings.default.svc.cluster.local
  trafficPolicy:
    portLevelSettings: [{port: {number: 9080}, tls: {mode: SIMPLE, sni: ratings.example, insecureSkipVerify: true}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    portLevelSettings: [{port: {number: 9080}, connectionPool: {tcp: {tcpKeepalive: {time: 1s}}}}]
`)
	r := serviceRoutes(t, c, "ratings")
	if len(r) != 1 || len(r[0].GetPorts()) != 1 || r[0].GetPorts()[0] != 9080 {
		t.Fatalf("ratings routes %v, want one scoped to port 9080", r)
	}
	b := r[0].GetRules()[0].GetBackends()[0]
	if tls := b.GetTrafficPolicy().GetTls(); b.GetPort() != 9080 || tls.GetSni() != "ratings.example" || !tls.GetInsecureSkipVerify() {
		t.Errorf("ratings backend %v", b)
	}
	if st := statusOf(sts, "DestinationRule", "default/ratings"); len(st.Invalid) != 0 {
		t.Errorf("ratings status %+v", st)
	}
	if st := statusOf(sts, "DestinationRule", "default/reviews"); len(st.Invalid) != 1 ||
		!strings.HasPrefix(st.Invalid[0], "spec.trafficPolicy.portLevelSettings[0].connectionPool.tcp.tcpKeepalive: ") {
		t.Errorf("reviews status %+v", st)
	}
}
