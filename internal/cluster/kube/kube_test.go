package kube

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// unreachable builds clients for an address nothing listens on: New must
// not contact the server.
func unreachable(t *testing.T) *Clients {
	t.Helper()
	c, err := NewClients(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewValidates(t *testing.T) {
	full := unreachable(t)
	kubeOnly := &Clients{Kube: full.Kube}
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
		kinds   []Kind
	}{
		{name: "no clients", cfg: Config{}, wantErr: "Clients.Kube is required"},
		{name: "all kinds", cfg: Config{Clients: full}, kinds: AllKinds()},
		{name: "agent kinds need only core", cfg: Config{Clients: kubeOnly, Kinds: AgentKinds(), NodeName: "n1"}, kinds: AgentKinds()},
		{name: "istio kinds need istio", cfg: Config{Clients: kubeOnly, Kinds: []Kind{ServiceEntries}}, wantErr: "Istio is required"},
		{name: "gateway kinds need gateway", cfg: Config{Clients: kubeOnly, Kinds: []Kind{GatewayClasses}}, wantErr: "Gateway is required"},
		{name: "unknown kind", cfg: Config{Clients: full, Kinds: []Kind{"Deployment"}}, wantErr: `unknown kind "Deployment"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []Kind
			for _, w := range s.watched {
				got = append(got, w.kind)
			}
			if strings.Join(kindStrings(got), ",") != strings.Join(kindStrings(tt.kinds), ",") {
				t.Fatalf("watched %v, want %v", got, tt.kinds)
			}
			if objs, _ := s.Current(); objs != nil {
				t.Fatal("Current is not nil before Run")
			}
		})
	}
}

// TestKindConstantsAndClientsets: every named Kind is a row of
// cluster.Kinds, and each row is read through the clientset of its group.
func TestKindConstantsAndClientsets(t *testing.T) {
	named := []Kind{Namespaces, Pods, Services, EndpointSlices, ServiceEntries, WorkloadEntries,
		AuthorizationPolicies, PeerAuthentications, Gateways, GatewayClasses}
	for _, k := range named {
		if !slices.Contains(AllKinds(), k) {
			t.Errorf("constant %q is not a cluster kind", k)
		}
	}
	want := map[Kind]api{Pods: apiKube, EndpointSlices: apiKube, ServiceEntries: apiIstio,
		PeerAuthentications: apiIstio, GatewayClasses: apiGateway}
	for _, k := range cluster.Kinds() {
		if a, ok := want[Kind(k.Name)]; ok && apiOf(k) != a {
			t.Errorf("%s read through clientset %d, want %d", k.Name, apiOf(k), a)
		}
	}
}

func kindStrings(ks []Kind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, string(k))
	}
	return out
}

func TestStripManagedFields(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	out, err := stripManagedFields(p)
	if err != nil || out.(*corev1.Pod).ManagedFields != nil || out.(*corev1.Pod).Name != "a" {
		t.Fatalf("got %+v, %v", out, err)
	}
	// A tombstone is not an object: passed through untouched.
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: p}
	if out, err := stripManagedFields(tomb); err != nil || out.(cache.DeletedFinalStateUnknown).Key != "ns/a" {
		t.Fatalf("tombstone: %v, %v", out, err)
	}
}

func TestSameVersion(t *testing.T) {
	a := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1"}}
	b := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "2"}}
	if !sameVersion(a, a.DeepCopy()) || sameVersion(a, b) || sameVersion("x", a) {
		t.Fatal("sameVersion wrong")
	}
}

func TestRunTwice(t *testing.T) {
	s, err := New(Config{Clients: &Clients{Kube: kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1"})}, Kinds: AgentKinds()})
	if err != nil {
		t.Fatal(err)
	}
	s.running.Store(true)
	if err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Run: %v", err)
	}
}
