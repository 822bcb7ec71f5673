package deploy_test

import (
	"strings"
	"testing"
)

// TestChartPeerCaCrl: ztunnel.peerCaCrl.enabled mounts the CRLs (Istio's
// istio-ca-crl ConfigMap by default, or a Secret) and points CRL_PATH at
// them; the volume is not optional (the node proxy does not run without
// the CRLs it was told to enforce). Off by default: nothing rendered.
func TestChartPeerCaCrl(t *testing.T) {
	common := []string{
		`- {name: CRL_PATH, value: "/var/run/secrets/istio-crl/ca-crl.pem"}`,
		"- {name: peer-ca-crl, mountPath: /var/run/secrets/istio-crl, readOnly: true}",
		"- name: peer-ca-crl",
	}
	out, err := helmTemplate(t, "--set", "ztunnel.peerCaCrl.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, want := range append(common, `configMap: {name: "istio-ca-crl"}`,
		// ztunnel-cp mounts them too and hands them to every waypoint.
		"- --waypoint-crl-file=/etc/ztunnel-cp/crl/ca-crl.pem",
		"- {name: peer-ca-crl, mountPath: /etc/ztunnel-cp/crl, readOnly: true}") {
		if !strings.Contains(out, want) {
			t.Errorf("peerCaCrl.enabled: no %q", want)
		}
	}
	if strings.Contains(out, "optional: true") {
		t.Error("peerCaCrl.enabled: the CRL volume must not be optional")
	}
	out, err = helmTemplate(t, "--set", "ztunnel.peerCaCrl.enabled=true", "--set", "ztunnel.peerCaCrl.secretName=mesh-crl",
		"--set", "ztunnel.peerCaCrl.key=crl.der")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	for _, want := range []string{`- {name: CRL_PATH, value: "/var/run/secrets/istio-crl/crl.der"}`, `secret: {secretName: "mesh-crl"}`,
		"- --waypoint-crl-file=/etc/ztunnel-cp/crl/crl.der"} {
		if !strings.Contains(out, want) {
			t.Errorf("peerCaCrl.secretName: no %q", want)
		}
	}
	if strings.Contains(out, `configMap: {name: "istio-ca-crl"}`) {
		t.Error("peerCaCrl.secretName: the ConfigMap is mounted too")
	}
	out, err = helmTemplate(t)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	// (The waypoint template in its ConfigMap names CRL_PATH for when
	// CRLs are enforced; no container sets it.)
	for _, unwanted := range []string{`{name: CRL_PATH, value: "`, "peer-ca-crl", "--waypoint-crl-file"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("by default: %q rendered", unwanted)
		}
	}
}
