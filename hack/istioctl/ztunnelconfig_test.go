// Package istioctl guards that Istio's own istioctl reads our node proxy:
// its ztunnel-config parser (istioctl/pkg/writer/ztunnel/configdump, the
// code `istioctl ztunnel-config` runs after it port-forwards to the admin
// port) decodes our /config_dump and renders every view with the values
// zctl shows.
package istioctl

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	istiodump "istio.io/istio/istioctl/pkg/writer/ztunnel/configdump"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/admin"
	"github.com/ztunnel-go/ztunnel-go/internal/node/configdump"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
)

// envAdmin names a running node proxy's admin address (host:port, e.g. a
// port-forward to the real node's ztunnel pod) to check instead of the
// local one; the mesh-specific rows are then not asserted.
const envAdmin = "ZTG_ISTIOCTL_ADMIN"

// mesh is what the local control plane serves: node0 runs client and
// server and the waypoint; ratings (node1) is bound to the waypoint, as
// its Service is; two policies and STRICT mTLS.
const mesh = `apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: demo, labels: {app: client}}
spec: {nodeName: node0, serviceAccountName: client, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIP: 10.0.0.10, podIPs: [{ip: 10.0.0.10}]}
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: demo, labels: {app: server}}
spec: {nodeName: node0, serviceAccountName: server, containers: [{name: app, image: app, ports: [{name: http, containerPort: 8080}]}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIP: 10.0.0.11, podIPs: [{ip: 10.0.0.11}]}
---
apiVersion: v1
kind: Pod
metadata: {name: ratings, namespace: demo, labels: {app: ratings, istio.io/use-waypoint: waypoint}}
spec: {nodeName: node1, serviceAccountName: ratings, containers: [{name: app, image: app, ports: [{name: http, containerPort: 9080}]}]}
status: {phase: Running, conditions: [{type: Ready, status: "False"}], podIP: 10.0.1.10, podIPs: [{ip: 10.0.1.10}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-0
  namespace: demo
  labels: {gateway.networking.k8s.io/gateway-name: waypoint, gateway.istio.io/managed: istio.io-mesh-controller, istio.io/dataplane-mode: none}
spec: {nodeName: node0, serviceAccountName: waypoint, containers: [{name: istio-proxy, image: waypoint}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIP: 10.0.0.30, podIPs: [{ip: 10.0.0.30}]}
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: demo}
spec: {clusterIP: 10.96.0.20, selector: {app: server}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: ratings, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec: {clusterIP: 10.96.0.21, selector: {app: ratings}, ports: [{name: http, port: 9080, targetPort: 9080}]}
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: demo, labels: {gateway.networking.k8s.io/gateway-name: waypoint, gateway.istio.io/managed: istio.io-mesh-controller}}
spec: {clusterIP: 10.96.0.30, selector: {gateway.networking.k8s.io/gateway-name: waypoint}, ports: [{name: mesh, port: 15008, targetPort: 15008}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo, labels: {istio.io/waypoint-for: all}}
spec: {gatewayClassName: istio-waypoint, listeners: [{name: mesh, port: 15008, protocol: HBONE}]}
status: {addresses: [{type: IPAddress, value: 10.96.0.30}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: server-allow-client, namespace: demo}
spec:
  selector: {matchLabels: {app: server}}
  action: ALLOW
  rules: [{from: [{source: {principals: [cluster.local/ns/demo/sa/client]}}], to: [{operation: {ports: ["8080"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-intruder, namespace: demo}
spec:
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/demo/sa/intruder]}}]}]
`

// TestIstioctlZtunnelConfig runs our control plane (local mode) and a node
// proxy as node0, both the real binaries, takes the proxy's /config_dump
// and has istioctl's ztunnel-config code parse it and render every view:
// workload, service, policy, certificate (secret), connections and all,
// each as the table and as JSON. The rows are the mesh's, with the same
// values `zctl config-dump` shows: pod addresses and waypoint, service
// VIPs, waypoint and healthy/total endpoints, policy action and scope,
// certificates with istioctl's hex rendering of our decimal serial. A
// second part dumps pod proxies with open connections through the same
// admin handler and checks istioctl's connections view.
func TestIstioctlZtunnelConfig(t *testing.T) {
	bins := buildBinaries(t)
	adminAddr := os.Getenv(envAdmin)
	local := adminAddr == ""
	if local {
		adminAddr = startLocalMesh(t, bins)
	}
	raw := fetchDump(t, adminAddr, local)

	views := renderViews(t, raw)
	t.Logf("istioctl ztunnel-config all (from %s):\n%s", adminAddr, views["all"])
	zctl := func(section string) string {
		out, err := exec.Command(filepath.Join(bins, "zctl"), "config-dump", "--admin", adminAddr, section).CombinedOutput()
		if err != nil {
			t.Fatalf("zctl config-dump %s: %v\n%s", section, err, out)
		}
		return string(out)
	}
	// zctl shows the same rows (its sections: workloads, services,
	// policies, certificates; dry-run policies it marks, istioctl not).
	for view, section := range map[string]string{"workload": "workloads", "service": "services", "policy": "policies", "certificate": "certificates"} {
		zrows := rows(zctl(section))
		irows := rows(views[view])
		if len(irows) < 2 {
			t.Errorf("istioctl %s view has no rows:\n%s", view, views[view])
		}
		for _, r := range irows {
			if !slices.Contains(zrows, r) {
				t.Errorf("istioctl %s row %q is not in zctl's %s:\n%s", view, r, section, strings.Join(zrows, "\n"))
			}
		}
	}
	if !local {
		return
	}

	for view, want := range map[string][]string{
		"workload": {
			"NAMESPACE POD NAME ADDRESS NODE WAYPOINT PROTOCOL",
			"demo client 10.0.0.10 node0 None HBONE",
			"demo ratings 10.0.1.10 node1 waypoint HBONE",
			"demo server 10.0.0.11 node0 None HBONE",
			"demo waypoint-0 10.0.0.30 node0 None TCP",
		},
		"service": {
			"NAMESPACE SERVICE NAME SERVICE VIP WAYPOINT ENDPOINTS",
			"demo ratings 10.96.0.21 waypoint 0/1", // ratings is not Ready
			"demo server 10.96.0.20 None 1/1",
			"demo waypoint 10.96.0.30 None 1/1", // never bound to itself
		},
		"policy": {
			"NAMESPACE POLICY NAME ACTION SCOPE",
			"demo deny-intruder Deny Namespace",
			"demo server-allow-client Allow WorkloadSelector",
		},
	} {
		for _, w := range want {
			if !slices.Contains(rows(views[view]), w) {
				t.Errorf("istioctl %s view lacks %q:\n%s", view, w, views[view])
			}
		}
	}

	// Certificates: node0's HBONE identities, each leaf and root with
	// istioctl's hex rendering of the serial the dump gives in decimal.
	var d struct {
		Certificates []struct {
			Identity             string
			CertChain, RootCerts []struct{ PEM, SerialNumber string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range d.Certificates {
		ids = append(ids, c.Identity)
		if len(c.CertChain) == 0 || len(c.RootCerts) == 0 {
			t.Fatalf("certificate %s: chain %d, roots %d", c.Identity, len(c.CertChain), len(c.RootCerts))
		}
		for kind, ci := range map[string]struct{ PEM, SerialNumber string }{"Leaf": c.CertChain[0], "Root": c.RootCerts[0]} {
			b, _ := pem.Decode([]byte(ci.PEM))
			if b == nil {
				t.Fatalf("%s %s: no PEM", c.Identity, kind)
			}
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if ci.SerialNumber != cert.SerialNumber.String() {
				t.Errorf("%s %s serial %q, want decimal %s", c.Identity, kind, ci.SerialNumber, cert.SerialNumber)
			}
			want := fmt.Sprintf("%s %s Available true %x %s %s", c.Identity, kind, cert.SerialNumber,
				cert.NotAfter.UTC().Format(time.RFC3339), cert.NotBefore.UTC().Format(time.RFC3339))
			if !slices.Contains(rows(views["certificate"]), want) {
				t.Errorf("istioctl certificate view lacks %q:\n%s", want, views["certificate"])
			}
		}
	}
	slices.Sort(ids)
	if want := []string{"spiffe://cluster.local/ns/demo/sa/client", "spiffe://cluster.local/ns/demo/sa/server"}; !slices.Equal(ids, want) {
		t.Errorf("certificates for %v, want %v", ids, want)
	}
	for _, section := range []string{"WORKLOAD INFO", "SERVICE INFO", "POLICY INFO", "SECRET INFO", "CONNECTIONS INFO"} {
		if !strings.Contains(views["all"], "------ "+section+" ------") {
			t.Errorf("istioctl all view lacks %s:\n%s", section, views["all"])
		}
	}

	t.Run("connections", testConnections)
}

// testConnections: pod proxies with open connections, dumped by the real
// admin handler, appear in istioctl's connections view under the pod that
// owns each end, with its names for the addresses.
func testConnections(t *testing.T) {
	s := state.NewStore()
	echo := proxytest.ServiceKey("demo", "echo")
	proxytest.Apply(t, s,
		proxytest.Pod("demo", "client", "10.0.0.1"),
		proxytest.Pod("demo", "server", "10.0.0.2", proxytest.InService(echo, 80, 8080)),
		proxytest.Service("demo", "echo", "10.96.0.10", []uint32{80, 8080}),
	)
	proxytest.ApplyPolicies(t, s, proxytest.Policy("demo", "allow-client", securityapi.Action_ALLOW,
		proxytest.Rule(proxytest.Principals("cluster.local/ns/demo/sa/sa-client"), proxytest.Ports(8080))))
	pods := inpodstate.Dump{SnapshotReceived: true, Pods: map[string]inpodstate.PodState{
		"uid-client": {Info: inpodstate.Workload{UID: "uid-client", Name: "client", Namespace: "demo", ServiceAccount: "sa-client"}, State: inpodstate.StateUp},
		"uid-server": {Info: inpodstate.Workload{UID: "uid-server", Name: "server", Namespace: "demo", ServiceAccount: "sa-server"}, State: inpodstate.StateUp},
	}}
	conns := []configdump.Connection{
		{Src: "10.0.0.1:40000", Dst: "10.0.0.2:15008", OriginalDst: "10.96.0.10:80", HBONE: "10.0.0.2:8080", Tunnelled: true},
		{Inbound: true, Src: "10.0.0.1:40000", Dst: "10.0.0.2:15008", HBONE: "10.0.0.2:8080", Service: "echo.demo.svc.cluster.local", Tunnelled: true},
	}
	h := admin.AdminHandler(admin.Deps{Level: zap.NewAtomicLevelAt(zapcore.InfoLevel), Dump: &admin.Dumper{
		State: s, Pods: func() inpodstate.Dump { return pods }, Connections: func() []configdump.Connection { return conns },
		TrustDomain: "cluster.local",
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	raw := fetchDump(t, strings.TrimPrefix(srv.URL, "http://"), false)
	views := renderViews(t, raw)
	for _, w := range []string{
		"WORKLOAD DIRECTION LOCAL REMOTE REMOTE TARGET PROTOCOL",
		"client.demo Outbound client.demo:40000 server.demo:15008 echo.demo.svc.cluster.local:80 HBONE",
		"server.demo Inbound server.demo:8080 client.demo:40000 echo.demo.svc.cluster.local HBONE",
	} {
		if !slices.Contains(rows(views["connections"]), w) {
			t.Errorf("istioctl connections view lacks %q:\n%s", w, views["connections"])
		}
	}
	if !strings.Contains(views["policy"], "demo allow-client Allow Namespace") && !slices.Contains(rows(views["policy"]), "demo allow-client Allow Namespace") {
		t.Errorf("istioctl policy view:\n%s", views["policy"])
	}
}

// renderViews primes istioctl's ConfigWriter with the dump and renders each
// ztunnel-config view: the summary tables, and the JSON each view prints
// with -o json (which must decode again).
func renderViews(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	var buf bytes.Buffer
	cw := &istiodump.ConfigWriter{Stdout: &buf, FullDump: raw}
	if err := cw.Prime(raw); err != nil {
		t.Fatalf("istioctl cannot parse the dump: %v", err)
	}
	views := map[string]string{}
	for name, f := range map[string]func() error{
		"workload":    func() error { return cw.PrintWorkloadSummary(istiodump.WorkloadFilter{}) },
		"service":     func() error { return cw.PrintServiceSummary(istiodump.ServiceFilter{}) },
		"policy":      func() error { return cw.PrintPolicySummary(istiodump.PolicyFilter{}) },
		"certificate": cw.PrintSecretSummary,
		"connections": func() error { return cw.PrintConnectionsSummary(istiodump.ConnectionsFilter{}) },
		"all":         func() error { return cw.PrintFullSummary(true) },
		"workload-json": func() error {
			return cw.PrintWorkloadDump(istiodump.WorkloadFilter{}, "json")
		},
		"service-json":     func() error { return cw.PrintServiceDump(istiodump.ServiceFilter{}, "json") },
		"policy-json":      func() error { return cw.PrintPolicyDump(istiodump.PolicyFilter{}, "json") },
		"certificate-json": func() error { return cw.PrintSecretDump("json") },
		"connections-json": func() error { return cw.PrintConnectionsDump(istiodump.ConnectionsFilter{}, "json") },
		"all-yaml":         func() error { return cw.PrintFullDump("yaml") },
	} {
		buf.Reset()
		if err := f(); err != nil {
			t.Fatalf("istioctl %s view: %v", name, err)
		}
		views[name] = buf.String()
		if strings.HasSuffix(name, "-json") {
			var v any
			if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
				t.Errorf("istioctl %s: %v\n%s", name, err, buf.String())
			}
		}
	}
	return views
}

// rows are the output's lines with each run of spaces made one.
func rows(out string) []string {
	var rs []string
	for l := range strings.SplitSeq(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rs = append(rs, strings.Join(f, " "))
		}
	}
	return rs
}

// buildBinaries builds ztunnel, ztunnel-cp and zctl from this checkout.
func buildBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/ztunnel", "./cmd/ztunnel-cp", "./cmd/zctl")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startLocalMesh runs ztunnel-cp on the mesh above and a node proxy as
// node0 against it; it returns the proxy's admin address.
func startLocalMesh(t *testing.T, bins string) string {
	t.Helper()
	dir := t.TempDir()
	meshDir, stateDir := filepath.Join(dir, "mesh"), filepath.Join(dir, "cp-state")
	tokens, token := filepath.Join(dir, "node-tokens"), filepath.Join(dir, "istio-token")
	for path, data := range map[string]string{filepath.Join(meshDir, "mesh.yaml"): mesh, tokens: "node0 node0-secret\n", token: "node0-secret\n"} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cpAddr := freePort(t)
	start(t, "ztunnel-cp", exec.Command(filepath.Join(bins, "ztunnel-cp"), "--config-dir", meshDir, "--listen", cpAddr,
		"--state-dir", stateDir, "--node-tokens", tokens, "--admin", "", "--metrics-addr", "", "--readiness-addr", ""))
	root := filepath.Join(stateDir, "root-cert.pem")
	waitFor(t, 60*time.Second, "the control plane listening", func() bool {
		c, err := net.Dial("tcp", cpAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	adminAddr := freePort(t)
	zt := exec.Command(filepath.Join(bins, "ztunnel"))
	zt.Env = append(os.Environ(), "NODE_NAME=node0", "INPOD_UDS="+filepath.Join(dir, "no-agent.sock"),
		"XDS_ADDRESS="+cpAddr, "XDS_ROOT_CA="+root, "CA_ROOT_CA="+root, "CA_ADDRESS="+cpAddr, "AUTH_TOKEN="+token,
		"ADMIN_ADDR="+adminAddr, "STATS_ADDR="+freePort(t), "READINESS_ADDR="+freePort(t), "DNS_PROXY=false")
	start(t, "ztunnel", zt)
	return adminAddr
}

// start runs cmd until the test ends, logging its output on failure.
func start(t *testing.T, name string, cmd *exec.Cmd) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, tail(out.String(), 4000))
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fetchDump GETs /config_dump; with wait, until the proxy has synced the
// mesh and fetched node0's certificates.
func fetchDump(t *testing.T, addr string, wait bool) []byte {
	t.Helper()
	get := func() ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/config_dump", nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %s: %s", resp.Status, b)
		}
		return b, err
	}
	if !wait {
		b, err := get()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var raw []byte
	waitFor(t, 60*time.Second, "the node proxy's state and certificates", func() bool {
		b, err := get()
		if err != nil {
			return false
		}
		var d struct {
			Workloads    []json.RawMessage
			Certificates []struct{ State string }
		}
		if json.Unmarshal(b, &d) != nil || len(d.Workloads) < 4 || len(d.Certificates) < 2 {
			return false
		}
		for _, c := range d.Certificates {
			if c.State != "Available" {
				return false
			}
		}
		raw = b
		return true
	})
	return raw
}
