package plugin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
)

// envRunPlugin makes the test binary act as the plugin binary: the tests
// exec themselves with CNI_* set, as a container runtime would.
const envRunPlugin = "ZTG_TEST_RUN_CNI_PLUGIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunPlugin) == "1" {
		plugin.Main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const prevResult = `{"cniVersion":"1.0.0",
 "interfaces":[{"name":"eth0","sandbox":"/var/run/netns/cni-1234"}],
 "ips":[{"interface":0,"address":"10.244.1.7/24","gateway":"10.244.1.1"},{"interface":0,"address":"fd00:10:244:1::7/64"}],
 "routes":[{"dst":"0.0.0.0/0"}],
 "dns":{"nameservers":["10.96.0.10"]}}`

const clusterYAML = `apiVersion: v1
kind: Namespace
metadata:
  name: mesh
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: plain
---
apiVersion: v1
kind: Pod
metadata:
  name: app-1
  namespace: mesh
spec:
  containers: [{name: app, image: app}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: plain
spec:
  containers: [{name: web, image: web}]
`

// fakeAgent is the agent's HTTP API on a unix socket.
type fakeAgent struct {
	socket string
	status int
	mu     sync.Mutex
	adds   []plugin.AddRequest
	logs   []map[string]any
}

func startAgent(t *testing.T, status int) *fakeAgent {
	t.Helper()
	a := &fakeAgent{socket: socketPath(t), status: status}
	ln, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+plugin.PathAdd, func(w http.ResponseWriter, r *http.Request) {
		var req plugin.AddRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.adds = append(a.adds, req)
		a.mu.Unlock()
		if a.status != http.StatusOK {
			http.Error(w, "pod netns not found", a.status)
			return
		}
		json.NewEncoder(w).Encode(plugin.AddResponse{Captured: true})
	})
	mux.HandleFunc("POST "+plugin.PathLog, func(w http.ResponseWriter, r *http.Request) {
		var e map[string]any
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.logs = append(a.logs, e)
		a.mu.Unlock()
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *fakeAgent) received() ([]plugin.AddRequest, []map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]plugin.AddRequest(nil), a.adds...), append([]map[string]any(nil), a.logs...)
}

func socketPath(t *testing.T) string {
	// Short: t.TempDir() can exceed the 108-byte unix socket path limit.
	dir, err := os.MkdirTemp("", "cni")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "pluginevent.sock")
}

func localDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(clusterYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func config(socket, dir string) string {
	c := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"ztunnel-cni","agent_socket":%q`, socket)
	if dir != "" {
		c += fmt.Sprintf(`,"local_config_dir":%q`, dir)
	}
	return c + `,"prevResult":` + prevResult + `}`
}

// netnsPath is CNI_NETNS: the plugin only forwards it, and skel accepts a
// path that does not exist (it only refuses the plugin's own netns).
const netnsPath = "/var/run/netns/zt-cni-plugin-test-absent"

type result struct {
	stdout, stderr string
	err            error
}

// cniError decodes the CNI error the plugin printed on failure.
func (r result) cniError(t *testing.T) (code uint, msg string) {
	t.Helper()
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	var ee *exec.ExitError
	if !errors.As(r.err, &ee) {
		t.Fatalf("plugin succeeded (err %v), want failure; stdout %s", r.err, r.stdout)
	}
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
		t.Fatalf("stdout %q is not a CNI error: %v", r.stdout, err)
	}
	return e.Code, e.Msg
}

func run(t *testing.T, command, conf, cniArgs string) result {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{
		envRunPlugin + "=1",
		"GORACE=atexit_sleep_ms=0", // a -race child otherwise sleeps 1 s on a clean exit
		"PATH=" + os.Getenv("PATH"),
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=0123456789abcdef",
		"CNI_NETNS=" + netnsPath,
		"CNI_IFNAME=eth0",
		"CNI_PATH=/opt/cni/bin",
		"CNI_ARGS=" + cniArgs,
	}
	cmd.Stdin = strings.NewReader(conf)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return result{stdout: out.String(), stderr: errb.String(), err: err}
}

func podArgs(ns, name string) string {
	return "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name + ";K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef;K8S_POD_UID=uid-" + name
}

// assertPrevResult checks the plugin printed prevResult unchanged.
func assertPrevResult(t *testing.T, r result) {
	t.Helper()
	if r.err != nil {
		t.Fatalf("plugin failed: %v\nstdout: %s\nstderr: %s", r.err, r.stdout, r.stderr)
	}
	var got, want any
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	if err := json.Unmarshal([]byte(prevResult), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("result changed:\n got %s\nwant %s", r.stdout, prevResult)
	}
}

func TestAddAmbientPodHandsItToTheAgent(t *testing.T) {
	agent := startAgent(t, http.StatusOK)
	r := run(t, "ADD", config(agent.socket, localDir(t)), podArgs("mesh", "app-1"))
	assertPrevResult(t, r)

	adds, logs := agent.received()
	want := []plugin.AddRequest{{
		Netns: netnsPath, PodName: "app-1", PodNamespace: "mesh", PodUID: "uid-app-1",
		IPs: []plugin.PodIP{
			{Interface: "eth0", Address: netip.MustParsePrefix("10.244.1.7/24"), Gateway: netip.MustParseAddr("10.244.1.1")},
			{Interface: "eth0", Address: netip.MustParsePrefix("fd00:10:244:1::7/64")},
		},
	}}
	if !reflect.DeepEqual(adds, want) {
		t.Fatalf("agent received %+v\nwant %+v", adds, want)
	}
	// The plugin's log line reached the agent, tagged with the pod.
	var found bool
	for _, l := range logs {
		found = found || l["pod"] == "app-1" && l["namespace"] == "mesh" && l["level"] == "info" && strings.Contains(fmt.Sprint(l["msg"]), "handed to the node agent")
	}
	if !found {
		t.Fatalf("agent log lines %v lack the pod's info line", logs)
	}
	if !strings.Contains(r.stderr, "handed to the node agent") {
		t.Fatalf("stderr %q lacks the log line", r.stderr)
	}
}

func TestAddWireFormat(t *testing.T) {
	// The agent's handler may not be Go: pin the JSON field names.
	b, err := json.Marshal(plugin.AddRequest{Netns: "/n", PodName: "p", PodNamespace: "ns", PodUID: "u",
		IPs: []plugin.PodIP{{Interface: "eth0", Address: netip.MustParsePrefix("10.0.0.2/24")}}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"Netns":"/n","PodName":"p","PodNamespace":"ns","PodUID":"u","IPs":[{"Interface":"eth0","Address":"10.0.0.2/24"}]}`
	if string(b) != want {
		t.Fatalf("AddRequest JSON\n got %s\nwant %s", b, want)
	}
}

func TestAddFailsClosedWhenAgentFails(t *testing.T) {
	down := socketPath(t) // nothing listens
	for _, tc := range []struct {
		name   string
		socket func(t *testing.T) string
		want   string
	}{
		{"agent down", func(*testing.T) string { return down }, "ztunnel-cni agent unreachable at " + down},
		{"agent answers 500", func(t *testing.T) string { return startAgent(t, http.StatusInternalServerError).socket }, "HTTP 500: pod netns not found"},
		{"no metadata source, agent down", nil, "ztunnel-cni agent unreachable at " + down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, socket := localDir(t), down
			if tc.socket == nil {
				dir = ""
			} else {
				socket = tc.socket(t)
			}
			r := run(t, "ADD", config(socket, dir), podArgs("mesh", "app-1"))
			code, msg := r.cniError(t)
			if code != 11 || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "no ambient pod starts uncaptured") {
				t.Fatalf("CNI error %d %q, want code 11 (try again later) mentioning %q", code, msg, tc.want)
			}
		})
	}
}

func TestAddPassesThroughWithoutAgent(t *testing.T) {
	down := socketPath(t) // nothing listens: any contact would fail the ADD
	disabled := strings.Replace(config(down, localDir(t)), `"type":"ztunnel-cni"`, `"type":"ztunnel-cni","ambient_enabled":false`, 1)
	for _, tc := range []struct {
		name, conf, args string
	}{
		{"pod in plain namespace", config(down, localDir(t)), podArgs("plain", "web-1")},
		{"unknown pod in plain namespace", config(down, localDir(t)), podArgs("plain", "later-1")},
		{"excluded namespace", strings.Replace(config(down, localDir(t)), `"type":"ztunnel-cni"`, `"type":"ztunnel-cni","exclude_namespaces":["mesh"]`, 1), podArgs("mesh", "app-1")},
		{"ambient disabled", disabled, podArgs("mesh", "app-1")},
		{"not a Kubernetes pod", config(down, localDir(t)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertPrevResult(t, run(t, "ADD", tc.conf, tc.args))
		})
	}
}

func TestAddUnknownPodInAmbientNamespaceFailsClosed(t *testing.T) {
	agent := startAgent(t, http.StatusOK)
	r := run(t, "ADD", config(agent.socket, localDir(t)), podArgs("mesh", "not-yet-1"))
	code, msg := r.cniError(t)
	if code != 11 || !strings.Contains(msg, "namespace is ambient") {
		t.Fatalf("CNI error %d %q, want 11 saying the namespace is ambient", code, msg)
	}
	if adds, _ := agent.received(); len(adds) != 0 {
		t.Fatalf("agent received %v for an unknown pod", adds)
	}
}

func TestDelAndCheckSucceed(t *testing.T) {
	down := socketPath(t)
	for _, cmd := range []string{"DEL", "CHECK"} {
		if r := run(t, cmd, config(down, ""), podArgs("mesh", "app-1")); r.err != nil || r.stdout != "" {
			t.Errorf("%s: err %v stdout %q stderr %q, want silent success", cmd, r.err, r.stdout, r.stderr)
		}
	}
	if r := run(t, "VERSION", "", ""); r.err != nil || !strings.Contains(r.stdout, `"1.0.0"`) {
		t.Errorf("VERSION: err %v stdout %q", r.err, r.stdout)
	}
}

func TestAddBadInputIsAClearError(t *testing.T) {
	agent := startAgent(t, http.StatusOK)
	for _, tc := range []struct {
		name, conf, want string
	}{
		{"config not JSON", `{"cniVersion":"1.0.0","name":"x",`, "unmarshal"},
		{"no prevResult", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"ztunnel-cni","agent_socket":%q}`, agent.socket), "no prevResult: this plugin must be chained"},
		{"bad log level", strings.Replace(config(agent.socket, ""), `"type":"ztunnel-cni"`, `"type":"ztunnel-cni","log_level":"loud"`, 1), `log_level "loud"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "ADD", tc.conf, podArgs("mesh", "app-1"))
			if _, msg := r.cniError(t); !strings.Contains(msg, tc.want) {
				t.Fatalf("CNI error %q, want it to mention %q", msg, tc.want)
			}
		})
	}
	if adds, _ := agent.received(); len(adds) != 0 {
		t.Fatalf("agent contacted on bad input: %v", adds)
	}
}

// With the pod metadata unreadable (here a kubeconfig this binary has no
// source for; in a cluster an API server down or a revoked token) the agent
// decides; excluded namespaces never need either; with both unavailable an
// ADD fails closed.
func TestAddMetadataUnavailable(t *testing.T) {
	kubeconf := func(socket string) string {
		return strings.Replace(config(socket, ""), `"type":"ztunnel-cni"`,
			`"type":"ztunnel-cni","kubeconfig":"/nonexistent/kubeconfig","exclude_namespaces":["kube-system"]`, 1)
	}
	t.Run("agent decides", func(t *testing.T) {
		agent := startAgent(t, http.StatusOK)
		assertPrevResult(t, run(t, "ADD", kubeconf(agent.socket), podArgs("plain", "web-1")))
		if adds, _ := agent.received(); len(adds) != 1 || adds[0].PodName != "web-1" {
			t.Fatalf("agent received %v, want the pod to decide on", adds)
		}
	})
	down := socketPath(t)
	t.Run("excluded namespace needs neither", func(t *testing.T) {
		assertPrevResult(t, run(t, "ADD", kubeconf(down), podArgs("kube-system", "dns-1")))
	})
	t.Run("neither available fails closed", func(t *testing.T) {
		code, msg := run(t, "ADD", kubeconf(down), podArgs("plain", "web-1")).cniError(t)
		if code != 11 || !strings.Contains(msg, "cannot decide either") {
			t.Fatalf("CNI error %d %q, want 11 saying nobody can decide", code, msg)
		}
	})
}
