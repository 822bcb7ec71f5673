package translate

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

func testSE(ns, name string, created int64, host string, addrs ...string) *networkingv1.ServiceEntry {
	return &networkingv1.ServiceEntry{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1", UID: types.UID("se-" + ns + "-" + name),
			CreationTimestamp: metav1.NewTime(time.Unix(created, 0))},
		Spec: networkingv1alpha3.ServiceEntry{
			Hosts: []string{host}, Addresses: addrs, Resolution: networkingv1alpha3.ServiceEntry_NONE,
			Ports: []*networkingv1alpha3.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}},
		},
	}
}

func canonicalOf(t *testing.T, r *Result) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for k, a := range r.Addresses.All() {
		if s := a.GetService(); s != nil {
			out[k] = s.GetCanonical()
		}
	}
	return out
}

// TestServiceCanonical follows istiod's rule for one hostname claimed by
// several objects: a Kubernetes Service is canonical; else the oldest
// ServiceEntry among the namespace winners. Incremental translation gets
// the same answer when a Service appears or goes away under a
// ServiceEntry's hostname in another namespace.
func TestServiceCanonical(t *testing.T) {
	const host = "reviews.bookinfo.svc.cluster.local"
	camp := testSE("team-a", "camp", 100, host, "10.99.0.7")
	other := testSE("team-b", "other", 200, host, "10.99.0.8")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: "reviews", ResourceVersion: "1", UID: "svc-reviews",
			CreationTimestamp: metav1.NewTime(time.Unix(300, 0))},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.7.7", Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
	}
	without := &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{other, camp}}
	with := &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{other, camp}, Services: []*corev1.Service{svc}}
	want := map[*cluster.Objects]map[string]bool{
		without: {"team-a/" + host: true, "team-b/" + host: false},
		with:    {"team-a/" + host: false, "team-b/" + host: false, "bookinfo/" + host: true},
	}
	tr := NewTranslator(LocalDefaults())
	for i, objs := range []*cluster.Objects{without, with, without} {
		objs.Sort()
		full := canonicalOf(t, Translate(LocalDefaults(), objs, nil))
		res, _ := tr.Update(objs, nil)
		inc := canonicalOf(t, res)
		for k, w := range want[objs] {
			if full[k] != w || inc[k] != w {
				t.Errorf("step %d: %s canonical = %v (full), %v (incremental), want %v", i, k, full[k], inc[k], w)
			}
		}
		if len(full) != len(want[objs]) {
			t.Errorf("step %d: services %v, want %v", i, full, want[objs])
		}
	}
}

// TestServiceEntryCIDRToNode: CIDR and single addresses of a resolution
// NONE ServiceEntry reach a node proxy's state as prefixes it matches
// (longest first, exact VIPs before them), and the service is a
// PASSTHROUGH one. With ZTG_ISTIO_SRC set, Istio's own
// samples/external/github.yaml is run through the same path.
func TestServiceEntryCIDRToNode(t *testing.T) {
	objs := loadObjects(t, "testdata/serviceentry-cidr-canonical.yaml")
	checks := map[string]string{
		"140.82.127.255":  "egress/dummy.github.com", // inside the /20
		"185.199.111.1":   "egress/dummy.github.com", // inside the /22
		"13.229.188.59":   "egress/dummy.github.com", // a /32: exact
		"2606:50c0:1::9":  "egress/dummy.github.com", // IPv6 /32
		"10.20.200.1":     "egress/db.internal",
		"192.0.2.50":      "team-b/api.example.com", // shared VIP: the canonical one
		"140.82.128.0":    "",                       // just past the /20
		"10.21.0.1":       "",
		"2606:50c1::1":    "",
		"185.199.107.255": "",
	}
	snap := nodeState(t, objs)
	for ip, want := range checks {
		got := snap.ServiceByVIP("", netip.MustParseAddr(ip), "")
		if gotKey := keyOf(got); gotKey != want {
			t.Errorf("ServiceByVIP(%s) = %q, want %q", ip, gotKey, want)
		}
	}
	gh := snap.ServiceByHost("egress/dummy.github.com")
	if gh.LoadBalancing == nil || gh.LoadBalancing.Mode != state.LBModePassthrough {
		t.Errorf("dummy.github.com load balancing = %+v, want PASSTHROUGH (resolution unset is NONE)", gh.LoadBalancing)
	}
	if got := snap.ServiceByVIP("", netip.MustParseAddr("10.99.0.7"), "team-a"); keyOf(got) != "team-a/reviews.bookinfo.svc.cluster.local" {
		t.Errorf("team-a's override of reviews = %q", keyOf(got))
	}

	root := os.Getenv("ZTG_ISTIO_SRC")
	if root == "" {
		t.Log("ZTG_ISTIO_SRC is not set: Istio's samples/external/github.yaml skipped")
		return
	}
	f := filepath.Join(root, "samples/external/github.yaml")
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var sample cluster.Objects
	if errs := cluster.Decode(f, data, &sample); len(errs) > 0 {
		t.Fatalf("decode %s: %v", f, errs)
	}
	sample.Sort()
	snap = nodeState(t, &sample)
	for _, ip := range []string{"140.82.112.3", "185.199.110.153", "192.30.255.1", "54.87.5.173"} {
		if got := snap.ServiceByVIP("", netip.MustParseAddr(ip), ""); got == nil || got.Hostname != "dummy.github.com" {
			t.Errorf("github.yaml: ServiceByVIP(%s) = %v, want dummy.github.com", ip, got)
		}
	}
	if got := snap.ServiceByVIP("", netip.MustParseAddr("140.82.128.1"), ""); got != nil {
		t.Errorf("github.yaml: 140.82.128.1 (outside every range) matched %s", got.Key)
	}
}

func nodeState(t *testing.T, objs *cluster.Objects) *state.Snapshot {
	t.Helper()
	res := Translate(LocalDefaults(), objs, nil)
	adds := map[string]*workloadapi.Address{}
	for k, a := range res.Addresses.All() {
		adds[k] = a
	}
	s := state.NewStore()
	if err := s.ApplyAddresses(adds, nil); err != nil {
		t.Fatalf("node proxy state refuses the translation: %v", err)
	}
	return s.Load()
}

func keyOf(s *state.Service) string {
	if s == nil {
		return ""
	}
	return s.Key
}
