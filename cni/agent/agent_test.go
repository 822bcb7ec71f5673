package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// waitTimeout bounds every testkit.Eventually here; it guards against hangs.
const waitTimeout = 10 * time.Second

// selfNetns stands in for every pod's namespace: unit tests apply rules to
// rules.Fake, so the namespace only has to be a real netns fd for ZDS.
const selfNetns = "/proc/self/ns/net"

const node = "node0"

// fakeSource is a cluster.Source the test sets.
type fakeSource struct {
	mu      sync.Mutex
	objs    *cluster.Objects
	changed chan struct{}
}

func newFakeSource() *fakeSource { return &fakeSource{changed: make(chan struct{})} }

func (s *fakeSource) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func (s *fakeSource) Current() (*cluster.Objects, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objs, s.changed
}

func (s *fakeSource) set(objs ...any) {
	o := &cluster.Objects{}
	for _, x := range objs {
		o.Add(x)
	}
	o.Sort()
	s.mu.Lock()
	s.objs = o
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

func ns(name string, ambient bool) *corev1.Namespace {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if ambient {
		n.Labels = map[string]string{plugin.LabelDataplaneMode: plugin.DataplaneModeAmbient}
	}
	return n
}

func pod(namespace, name, ip string, running bool, ann map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name), Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: "sa-" + name},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	if running {
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

// fakeHost records the probe ipset.
type fakeHost struct {
	mu  sync.Mutex
	set map[netip.Addr]bool
}

func (h *fakeHost) Setup() error { return nil }
func (h *fakeHost) AddPodIPs(ips []netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ip := range ips {
		h.set[ip] = true
	}
	return nil
}
func (h *fakeHost) DelPodIPs(ips []netip.Addr) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ip := range ips {
		delete(h.set, ip)
	}
	return nil
}
func (h *fakeHost) Teardown() error { return nil }
func (h *fakeHost) has(ip string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.set[netip.MustParseAddr(ip)]
}

// proxy is a recording ZDS client.
type proxy struct {
	events chan string
	nack   string
}

func (p *proxy) Add(uid string, info *zdsapi.WorkloadInfo, h *netns.Handle) error {
	h.Close()
	p.events <- fmt.Sprintf("add %s %s/%s sa=%s", uid, info.GetNamespace(), info.GetName(), info.GetServiceAccount())
	if p.nack != "" {
		return errors.New(p.nack)
	}
	return nil
}
func (p *proxy) Keep(uid string) error { p.events <- "keep " + uid; return nil }
func (p *proxy) Del(uid string) error  { p.events <- "del " + uid; return nil }
func (p *proxy) SnapshotSent(seen []string) error {
	p.events <- "snapshot " + strings.Join(seen, ",")
	return nil
}

func (p *proxy) want(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-p.events:
		if got != want {
			t.Fatalf("proxy event %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no proxy event; want %q", want)
	}
}

// env is one agent under test with its fakes.
type env struct {
	t       *testing.T
	dir     string
	src     *fakeSource
	fake    *rules.Fake // every pod's namespace (tests use one captured pod at a time)
	host    *fakeHost
	logs    *observer.ObservedLogs
	a       *Agent
	cancel  context.CancelFunc
	done    chan error
	reconc  bool
	findErr error
}

func newEnv(t *testing.T) *env {
	return &env{t: t, dir: t.TempDir(), src: newFakeSource(), fake: rules.NewFake(), host: &fakeHost{set: map[netip.Addr]bool{}}}
}

func (e *env) config() Config {
	core, logs := observer.New(zap.DebugLevel)
	e.logs = logs
	return Config{
		NodeName:           node,
		Source:             e.src,
		ZDSSocket:          filepath.Join(e.dir, "zds.sock"),
		PluginSocket:       filepath.Join(e.dir, "plugin.sock"),
		StateDir:           filepath.Join(e.dir, "state"),
		Defaults:           rules.PodSettings{DNSCapture: true},
		ReconcileOnStartup: e.reconc,
		Resync:             50 * time.Millisecond,
		Log:                zap.New(core),
		Applier:            func(string, *netns.Handle) rules.Applier { return e.fake },
		Host:               e.host,
		FindNetns: func(context.Context, *corev1.Pod, string) (string, *netns.Handle, error) {
			if e.findErr != nil {
				return "", nil, e.findErr
			}
			h, err := netns.Open(selfNetns)
			return selfNetns, h, err
		},
	}
}

// start runs a new agent (the source must be set).
func (e *env) start(cfg Config) {
	e.t.Helper()
	a, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.a, e.cancel, e.done = a, cancel, make(chan error, 1)
	go func() { e.done <- a.Run(ctx) }()
	e.t.Cleanup(e.stop)
	testkit.Eventually(e.t, waitTimeout, "agent ready", a.Ready)
}

func (e *env) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	if err := <-e.done; err != nil {
		e.t.Errorf("Run: %v", err)
	}
	e.cancel = nil
}

// connect runs a recording proxy until the test ends and waits for its
// snapshot.
func (e *env) connect(nack string) *proxy {
	e.t.Helper()
	p := &proxy{events: make(chan string, 100), nack: nack}
	c, err := zds.NewClient(zds.ClientConfig{Path: e.a.cfg.ZDSSocket, Handler: p})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
	testkit.Eventually(e.t, waitTimeout, "proxy connected", func() bool { return e.a.ZDS().Connected() > 0 })
	return p
}

func (e *env) status(uid string) (PodStatus, bool) {
	for _, s := range e.a.Pods() {
		if s.UID == uid {
			return s, true
		}
	}
	return PodStatus{}, false
}

func addReq(p *corev1.Pod, ip string) plugin.AddRequest {
	return plugin.AddRequest{Netns: selfNetns, PodName: p.Name, PodNamespace: p.Namespace, PodUID: string(p.UID),
		IPs: []plugin.PodIP{{Interface: "eth0", Address: netip.PrefixFrom(netip.MustParseAddr(ip), 24)}}}
}

// applied reports whether the fake holds exactly the rules of s.
func (e *env) applied(s rules.PodSettings) bool {
	rs, err := rules.InPod(s)
	if err != nil {
		e.t.Fatal(err)
	}
	d, err := e.fake.Check(rs)
	if err != nil {
		e.t.Fatal(err)
	}
	return d.Empty()
}

func (e *env) hasRules() bool {
	chains, _ := e.fake.Tables(rules.IPv4).ListChains("nat")
	return slices.Contains(chains, rules.ChainOutput)
}

func TestCNIAdd(t *testing.T) {
	mesh, plain := ns("mesh", true), ns("plain", false)
	dnsOn := rules.PodSettings{DNSCapture: true}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		proxy     bool
		nack      string
		wantErr   error
		captured  bool
		state     State
		wantRules *rules.PodSettings // nil: no rules
	}{
		{name: "ambient namespace", pod: pod("mesh", "a", "", false, nil), proxy: true, captured: true, state: StateEnabled, wantRules: &dnsOn},
		{name: "dns capture off by annotation", pod: pod("mesh", "a", "", false, map[string]string{rules.AnnotationDNSCapture: "false"}),
			proxy: true, captured: true, state: StateEnabled, wantRules: &rules.PodSettings{}},
		{name: "exclusions", pod: pod("mesh", "a", "", false, map[string]string{rules.AnnotationExcludeOutboundPorts: "8080", rules.AnnotationExcludeOutboundIPRanges: "10.9.0.0/16"}),
			proxy: true, captured: true, state: StateEnabled, wantRules: &rules.PodSettings{DNSCapture: true, ExcludeOutboundPorts: []uint16{8080}, ExcludeOutboundIPRanges: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}},
		{name: "no proxy: rules stay, pending", pod: pod("mesh", "a", "", false, nil), wantErr: ErrPending, state: StatePending, wantRules: &dnsOn},
		{name: "proxy refuses: pending", pod: pod("mesh", "a", "", false, nil), proxy: true, nack: "no room", wantErr: ErrPending, state: StatePending, wantRules: &dnsOn},
		{name: "bad annotation fails the ADD", pod: pod("mesh", "a", "", false, map[string]string{rules.AnnotationExcludeOutboundPorts: "http"}), proxy: true, wantErr: ErrBadSettings, state: StateFailed},
		{name: "plain namespace", pod: pod("plain", "b", "", false, nil), proxy: true},
		{name: "opt out", pod: func() *corev1.Pod {
			p := pod("mesh", "c", "", false, nil)
			p.Labels = map[string]string{plugin.LabelDataplaneMode: plugin.DataplaneModeNone}
			return p
		}(), proxy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.src.set(mesh, plain, tc.pod)
			e.start(e.config())
			var px *proxy
			if tc.proxy {
				px = e.connect(tc.nack)
				px.want(t, "snapshot ")
			}
			captured, err := e.a.CNIAdd(context.Background(), addReq(tc.pod, "10.0.0.5"))
			if !errors.Is(err, tc.wantErr) || captured != tc.captured {
				t.Fatalf("CNIAdd = %v, %v; want %v, %v", captured, err, tc.captured, tc.wantErr)
			}
			if tc.wantRules == nil {
				if e.hasRules() {
					t.Fatal("rules installed for a pod that must stay untouched")
				}
			} else if !e.applied(*tc.wantRules) {
				t.Fatalf("rules in the pod are not those of %+v", *tc.wantRules)
			}
			st, ok := e.status(string(tc.pod.UID))
			if tc.state == "" {
				if ok {
					t.Fatalf("status for an untouched pod: %+v", st)
				}
				return
			}
			if !ok || st.State != tc.state {
				t.Fatalf("status %+v, want state %s", st, tc.state)
			}
			if tc.wantRules != nil && st.DNSCapture != tc.wantRules.DNSCapture {
				t.Fatalf("status DNSCapture %v, want %v", st.DNSCapture, tc.wantRules.DNSCapture)
			}
			if got := e.host.has("10.0.0.5"); got != (tc.wantRules != nil) {
				t.Fatalf("probe ipset holds the pod: %v, want %v", got, tc.wantRules != nil)
			}
			if px != nil && tc.wantRules != nil {
				px.want(t, "add uid-a mesh/a sa=sa-a")
			}
		})
	}
}

// A pending pod whose ADD failed gets through on the runtime's retry once a
// proxy is there.
func TestCNIAddRetryAfterProxyConnects(t *testing.T) {
	e := newEnv(t)
	p := pod("mesh", "a", "", false, nil)
	e.src.set(ns("mesh", true), p)
	e.start(e.config())
	if _, err := e.a.CNIAdd(context.Background(), addReq(p, "10.0.0.5")); !errors.Is(err, ErrPending) {
		t.Fatalf("CNIAdd without proxy: %v, want ErrPending", err)
	}
	px := e.connect("")
	px.want(t, "snapshot ") // pending pods are not announced
	if _, err := e.a.CNIAdd(context.Background(), addReq(p, "10.0.0.5")); err != nil {
		t.Fatalf("retried CNIAdd: %v", err)
	}
	px.want(t, "add uid-a mesh/a sa=sa-a")
	if st, _ := e.status("uid-a"); st.State != StateEnabled {
		t.Fatalf("state %s, want enabled", st.State)
	}
}

// The CNI ADD waits for the source to show the pod.
func TestCNIAddWaitsForSource(t *testing.T) {
	e := newEnv(t)
	e.src.set(ns("mesh", true))
	e.start(e.config())
	e.connect("")
	p := pod("mesh", "a", "", false, nil)
	time.AfterFunc(200*time.Millisecond, func() { e.src.set(ns("mesh", true), p) })
	if ok, err := e.a.CNIAdd(context.Background(), addReq(p, "10.0.0.5")); err != nil || !ok {
		t.Fatalf("CNIAdd = %v, %v", ok, err)
	}
	e.src.set(ns("mesh", true)) // the pod goes away again
	testkit.Eventually(e.t, waitTimeout, "pod forgotten", func() bool { _, ok := e.status("uid-a"); return !ok })
	// The pod's namespace went with the pod, so the agent does not touch
	// it: the fake still holding the rules proves no Remove ran.
	if !e.hasRules() {
		t.Fatal("rules removed from a deleted pod's namespace")
	}
}

func TestLabelLifecycle(t *testing.T) {
	e := newEnv(t)
	p := pod("apps", "a", "10.0.0.7", true, nil)
	e.src.set(ns("apps", false), p)
	e.start(e.config())
	px := e.connect("")
	px.want(t, "snapshot ")
	if e.hasRules() {
		t.Fatal("rules in a plain namespace's pod")
	}

	e.src.set(ns("apps", true), p)
	px.want(t, "add uid-a apps/a sa=sa-a")
	testkit.Eventually(e.t, waitTimeout, "enabled", func() bool { st, _ := e.status("uid-a"); return st.State == StateEnabled && st.Via == viaWatch })
	if !e.applied(rules.PodSettings{DNSCapture: true}) || !e.host.has("10.0.0.7") {
		t.Fatal("labelled namespace: rules or probe ipset entry missing")
	}

	e.src.set(ns("apps", false), p)
	px.want(t, "del uid-a")
	testkit.Eventually(e.t, waitTimeout, "status cleared", func() bool { _, ok := e.status("uid-a"); return !ok })
	if e.hasRules() || e.host.has("10.0.0.7") {
		t.Fatal("unlabelled namespace: rules or probe ipset entry left")
	}
}

func TestRunningPodNetnsNotFound(t *testing.T) {
	e := newEnv(t)
	e.findErr = ErrNetnsUnproven
	e.src.set(ns("apps", true), pod("apps", "a", "10.0.0.7", true, nil))
	e.start(e.config())
	testkit.Eventually(e.t, waitTimeout, "failed status", func() bool {
		st, _ := e.status("uid-a")
		return st.State == StateFailed && strings.Contains(st.Error, ErrNetnsUnproven.Error())
	})
	if e.hasRules() {
		t.Fatal("rules without a netns")
	}
}

// A restarted agent remembers the pod: the next proxy gets it in the
// snapshot; reconciliation repairs drift only when enabled; UpToDate flags
// pods whose rules predate a default change.
func TestRestart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		reconcile bool
		dnsAfter  bool
	}{
		{"no reconcile", false, true},
		{"reconcile", true, true},
		{"reconcile after default change", true, false},
		{"default change without reconcile", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := pod("mesh", "a", "10.0.0.5", true, nil)
			e.src.set(ns("mesh", true), p)
			e.start(e.config())
			px := e.connect("")
			px.want(t, "snapshot ")
			if _, err := e.a.CNIAdd(context.Background(), addReq(p, "10.0.0.5")); err != nil {
				t.Fatal(err)
			}
			px.want(t, "add uid-a mesh/a sa=sa-a")
			e.stop()

			// Drift: delete one rule by hand.
			if err := e.fake.Tables(rules.IPv4).Delete("nat", rules.ChainOutput, "-p", "tcp", "-m", "mark", "--mark", "0x111/0xfff", "-j", "ACCEPT"); err != nil {
				t.Fatal(err)
			}
			e.reconc = tc.reconcile
			cfg := e.config()
			cfg.Defaults.DNSCapture = tc.dnsAfter
			e.start(cfg)
			px2 := e.connect("")
			px2.want(t, "add uid-a mesh/a sa=sa-a")
			px2.want(t, "snapshot uid-a")

			want := rules.PodSettings{DNSCapture: tc.dnsAfter}
			if got := e.applied(want); got != tc.reconcile {
				t.Fatalf("rules match %+v after restart: %v, want %v", want, got, tc.reconcile)
			}
			st, _ := e.status("uid-a")
			if st.State != StateEnabled || st.Via != viaRestored || st.UpToDate == nil {
				t.Fatalf("status %+v", st)
			}
			if wantUp := tc.reconcile || tc.dnsAfter; *st.UpToDate != wantUp {
				t.Fatalf("UpToDate %v, want %v", *st.UpToDate, wantUp)
			}
			if tc.reconcile && e.logs.FilterMessage("reconcile: pod rules differ; repairing").Len() != 1 {
				t.Fatal("the repair was not logged")
			}
		})
	}
}

func TestPluginServer(t *testing.T) {
	e := newEnv(t)
	good := pod("mesh", "a", "", false, nil)
	bad := pod("mesh", "bad", "", false, map[string]string{rules.AnnotationExcludeInboundPorts: "99999"})
	e.src.set(ns("mesh", true), good, bad)
	e.start(e.config())
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.a.cfg.PluginSocket)
	}}}
	post := func(path string, body any) (int, string) {
		b, _ := json.Marshal(body)
		resp, err := client.Post("http://unix"+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		out.ReadFrom(resp.Body)
		return resp.StatusCode, out.String()
	}
	for _, tc := range []struct {
		name string
		req  plugin.AddRequest
		code int
		body string
	}{
		{"no proxy", addReq(good, "10.0.0.5"), http.StatusServiceUnavailable, "pending"},
		{"bad annotation", addReq(bad, "10.0.0.6"), http.StatusBadRequest, "excludeInboundPorts"},
		{"unknown pod", plugin.AddRequest{Netns: selfNetns, PodName: "ghost", PodNamespace: "mesh"}, http.StatusServiceUnavailable, "not found"},
		{"no netns", plugin.AddRequest{PodName: "a", PodNamespace: "mesh"}, http.StatusBadRequest, "without"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(plugin.PathAdd, tc.req)
			if code != tc.code || !strings.Contains(body, tc.body) {
				t.Fatalf("POST %s = %d %q, want %d containing %q", plugin.PathAdd, code, body, tc.code, tc.body)
			}
		})
	}
	e.connect("")
	code, body := post(plugin.PathAdd, addReq(good, "10.0.0.5"))
	if code != http.StatusOK || !strings.Contains(body, `"captured":true`) {
		t.Fatalf("POST with proxy = %d %q", code, body)
	}

	if code, _ := post(plugin.PathLog, map[string]any{"level": "warn", "msg": "hello from the plugin", "pod": "a", "namespace": "mesh", "error": "boom"}); code != http.StatusNoContent {
		t.Fatalf("POST %s = %d", plugin.PathLog, code)
	}
	testkit.Eventually(e.t, waitTimeout, "plugin line", func() bool {
		l := e.logs.FilterMessage("hello from the plugin").All()
		return len(l) == 1 && l[0].ContextMap()["pod"] == "mesh/a" && l[0].ContextMap()["error"] == "boom" && l[0].Level == zap.WarnLevel
	})

	rec := httptest.NewRecorder()
	e.a.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/pods", nil))
	var pods []PodStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &pods); err != nil {
		t.Fatal(err)
	}
	states := map[string]State{}
	for _, p := range pods {
		states[p.Name] = p.State
	}
	if states["a"] != StateEnabled || states["bad"] != StateFailed || len(states) != 2 {
		t.Fatalf("GET /pods states %v", states)
	}
}

// TestRunSourceFailsBeforeFirstRead: a cluster source that fails before its
// first read (a missing --local-config directory) ends Run promptly with
// the source's error. Run used to wait for a first read that never came
// and, once stopped, return nil.
func TestRunSourceFailsBeforeFirstRead(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	missing := filepath.Join(e.dir, "no-such-dir")
	cfg.Source = local.New(missing, zap.NewNop(), 0)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "cluster source") || !strings.Contains(err.Error(), missing) {
			t.Fatalf("Run = %v, want the cluster source's error naming %s", err, missing)
		}
	case <-time.After(5 * time.Second):
		cancel()
		t.Fatalf("Run still waiting 5s after its cluster source failed; after a stop it returned %v", <-done)
	}
	if a.Ready() {
		t.Fatal("agent reported ready without a cluster view")
	}
}
