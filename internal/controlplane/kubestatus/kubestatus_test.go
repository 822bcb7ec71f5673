package kubestatus

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
)

func TestDesired(t *testing.T) {
	st := autoalloc.State{Allocations: []autoalloc.Allocation{
		{Namespace: "a", Name: "se", Host: "y.example", V4: netip.MustParseAddr("240.240.0.2"), V6: netip.MustParseAddr("2001:2::2")},
		{Namespace: "a", Name: "se", Host: "x.example", V6: netip.MustParseAddr("2001:2::1"), V4: netip.MustParseAddr("240.240.0.1")},
		{Namespace: "b", Name: "other", Host: "z.example", V4: netip.MustParseAddr("240.240.0.3")},
	}}
	got := Desired(st)
	want := map[string][]Address{
		"a/se":    {{"240.240.0.1", "x.example"}, {"2001:2::1", "x.example"}, {"240.240.0.2", "y.example"}, {"2001:2::2", "y.example"}},
		"b/other": {{"240.240.0.3", "z.example"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Desired = %v\nwant %v", got, want)
	}
	if len(Desired(autoalloc.State{})) != 0 {
		t.Fatal("empty state gives allocations")
	}
}

func TestSameSet(t *testing.T) {
	a := []Address{{"240.240.0.1", "x"}, {"2001:2::1", "x"}}
	b := []Address{{"2001:2::1", "x"}, {"240.240.0.1", "x"}}
	if !sameSet(a, b) || sameSet(a, a[:1]) || sameSet(a, []Address{{"240.240.0.1", "y"}, {"2001:2::1", "x"}}) || !sameSet(nil, []Address{}) {
		t.Fatal("sameSet wrong")
	}
}

// TestPatchVariants applies the patches with the JSON patch library the
// API server uses to documents in every starting state: exactly the
// intended variant applies, and a changed previous value or a different
// object makes every variant fail its test.
func TestPatchVariants(t *testing.T) {
	old := []Address{{"240.240.0.1", "x"}}
	neu := []Address{{"240.240.0.9", "x"}, {"2001:2::9", "x"}}
	other := []Address{{"240.240.0.5", "x"}}
	doc := func(uid string, status any) string {
		m := map[string]any{"metadata": map[string]any{"uid": uid, "name": "se"}, "spec": map[string]any{"hosts": []string{"x"}}}
		if status != nil {
			m["status"] = status
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	tests := []struct {
		name       string
		doc        string
		have, want []Address
		// wantStatus is the status after the first applying variant; nil
		// means no variant may apply (a lost test).
		wantStatus any
	}{
		{name: "no status at all", doc: doc("u1", nil), want: neu, wantStatus: map[string]any{"addresses": neu}},
		{name: "status without addresses", doc: doc("u1", map[string]any{"observedGeneration": 3}), want: neu,
			wantStatus: map[string]any{"observedGeneration": 3, "addresses": neu}},
		{name: "replace previous", doc: doc("u1", map[string]any{"addresses": old}), have: old, want: neu, wantStatus: map[string]any{"addresses": neu}},
		{name: "clear", doc: doc("u1", map[string]any{"addresses": old, "observedGeneration": 1}), have: old,
			wantStatus: map[string]any{"observedGeneration": 1}},
		{name: "another writer set addresses first", doc: doc("u1", map[string]any{"addresses": other}), want: neu},
		{name: "previous value changed", doc: doc("u1", map[string]any{"addresses": other}), have: old, want: neu},
		{name: "recreated object", doc: doc("u2", map[string]any{"addresses": old}), have: old, want: neu},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var applied []byte
			for _, body := range PatchVariants("u1", tt.have, tt.want) {
				p, err := jsonpatch.DecodePatch(body)
				if err != nil {
					t.Fatalf("decode %s: %v", body, err)
				}
				out, err := p.Apply([]byte(tt.doc))
				if err == nil {
					applied = out
					break
				}
				if !errors.Is(err, jsonpatch.ErrTestFailed) && !errors.Is(err, jsonpatch.ErrMissing) {
					t.Fatalf("unexpected patch error %v", err)
				}
			}
			if tt.wantStatus == nil {
				if applied != nil {
					t.Fatalf("a variant applied: %s", applied)
				}
				return
			}
			if applied == nil {
				t.Fatal("no variant applied")
			}
			var got map[string]any
			if err := json.Unmarshal(applied, &got); err != nil {
				t.Fatal(err)
			}
			wb, _ := json.Marshal(tt.wantStatus)
			var want any
			_ = json.Unmarshal(wb, &want)
			if !reflect.DeepEqual(got["status"], want) {
				t.Fatalf("status = %v, want %v", got["status"], want)
			}
		})
	}
	if PatchVariants("u", nil, nil) != nil && len(PatchVariants("u", nil, nil)) != 0 {
		t.Fatal("nothing to do should give no patch")
	}
}

func TestNewDefaults(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("missing clients accepted")
	}
}

// staticSource is a cluster.Source that always shows one set.
type staticSource struct{ objs *cluster.Objects }

func (s staticSource) Run(context.Context) error { return nil }
func (s staticSource) Current() (*cluster.Objects, <-chan struct{}) {
	return s.objs, make(chan struct{})
}

func se(rv string, addrs ...string) *networkingv1.ServiceEntry {
	e := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "se", UID: "u1", ResourceVersion: rv}}
	e.Spec.Hosts = []string{"x"}
	for _, a := range addrs {
		e.Status.Addresses = append(e.Status.Addresses, &networkingv1alpha3.ServiceEntryAddress{Value: a, Host: "x"})
	}
	return e
}

// TestReconcileDefers: a status that changed after the allocator's last
// look is left alone until it settles; equal status is never written; an
// unreachable API server counts as a failed write.
func TestReconcileDefers(t *testing.T) {
	saved := &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se("1")}}
	src := &staticSource{objs: saved}
	// Nothing listens there: any write fails.
	w, err := New(Config{Istio: istioclient.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}),
		Kube: kubernetes.NewForConfigOrDie(&rest.Config{Host: "https://127.0.0.1:1"}), Source: src})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if f, d := w.reconcile(ctx, saved, false); f != 0 || d != 0 {
		t.Fatalf("before any Save: failed=%d deferred=%d", f, d)
	}
	st := autoalloc.State{Allocations: []autoalloc.Allocation{{Namespace: "ns", Name: "se", Host: "x", V4: netip.MustParseAddr("240.240.0.1")}}}
	_ = w.Save(st)
	tests := []struct {
		name             string
		objs             *cluster.Objects
		settled          bool
		failed, deferred int
	}{
		{name: "status equals desired", objs: &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se("2", "240.240.0.1")}}},
		{name: "someone else's addresses, unsettled", objs: &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se("2", "240.240.0.7")}}, deferred: 1},
		{name: "someone else's addresses, settled", objs: &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se("2", "240.240.0.7")}}, settled: true, failed: 1},
		{name: "no status yet: written at once", objs: &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se("2")}}, failed: 1},
		{name: "unchanged since Save: written at once", objs: &cluster.Objects{ServiceEntries: []*networkingv1.ServiceEntry{se("1", "240.240.0.7")}}, failed: 1},
	}
	for _, tt := range tests {
		f, d := w.reconcile(ctx, tt.objs, tt.settled)
		if f != tt.failed || d != tt.deferred {
			t.Errorf("%s: failed=%d deferred=%d, want %d, %d", tt.name, f, d, tt.failed, tt.deferred)
		}
	}
}
