package translate

import (
	"net/netip"
	"strings"
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// TestExportTo: exportTo on ServiceEntries and the exportTo annotation on
// Services, with the mesh defaults and serviceEntryVisibility, decide which
// client namespaces see each service on the node (route and DNS both ask
// Service.VisibleTo).
func TestExportTo(t *testing.T) {
	se := func(ns, name, addr string, exportTo ...string) *networkingv1.ServiceEntry {
		s := testSE(ns, name, 1000, name+".example", addr)
		s.Spec.ExportTo = exportTo
		return s
	}
	svc := func(ns, name, ip, exportTo string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
			Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
		if exportTo != "" {
			s.Annotations = map[string]string{AnnotationExportTo: exportTo}
		}
		return s
	}
	objs := &cluster.Objects{
		Namespaces: []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "sandbox", Labels: map[string]string{"tier": "untrusted"}}},
		},
		ServiceEntries: []*networkingv1.ServiceEntry{
			se("team-a", "private", "192.0.2.1", "."),
			se("team-a", "shared", "192.0.2.2", ".", "team-b"),
			se("team-a", "public", "192.0.2.3"),
			se("team-a", "nobody", "192.0.2.4", "~"),
			se("team-a", "bad", "192.0.2.5", "*", "team-b"),
			// Same address as team-a/private, both visible to their own
			// namespace only: no namespace sees both, so no conflict.
			se("team-c", "private", "192.0.2.1", "."),
			se("sandbox", "egress", "192.0.2.6"),
		},
		Services: []*corev1.Service{
			svc("team-a", "web", "10.96.0.1", ".,team-b"),
			svc("team-a", "api", "10.96.0.2", ""),
			svc("team-a", "hidden", "10.96.0.3", "~"),
		},
	}
	objs.Sort()
	cfg := LocalDefaults()
	cfg.DefaultServiceExportTo = []string{"."}
	cfg.ServiceEntryVisibility = &meshv1alpha1.ServiceEntryVisibility{
		DefaultVisibility: meshv1alpha1.ServiceEntryVisibility_PUBLIC,
		Policies: []*meshv1alpha1.ServiceEntryVisibility_Policy{{
			Visibility: meshv1alpha1.ServiceEntryVisibility_NONE,
			MatchingRules: []*meshv1alpha1.ServiceEntryVisibility_MatchRule{{Matcher: &meshv1alpha1.ServiceEntryVisibility_MatchRule_NamespaceSelector{
				NamespaceSelector: &meshv1alpha1.LabelSelector{MatchLabels: map[string]string{"tier": "untrusted"}}}}},
		}},
	}
	res := Translate(cfg, objs, nil)
	snap := nodeStateOf(t, res)
	type row struct {
		addr string
		seen map[string]string // client namespace → service key ("" = none)
	}
	a, c := "team-a/", "team-c/"
	for _, r := range []row{
		{"192.0.2.1", map[string]string{"team-a": a + "private.example", "team-b": "", "team-c": c + "private.example"}},
		{"192.0.2.2", map[string]string{"team-a": a + "shared.example", "team-b": a + "shared.example", "team-c": ""}},
		// No exportTo: the mesh default "." applies.
		{"192.0.2.3", map[string]string{"team-a": a + "public.example", "team-b": ""}},
		// "~": sent to nobody.
		{"192.0.2.4", map[string]string{"team-a": "", "team-b": ""}},
		// Invalid exportTo: narrowed to its own namespace.
		{"192.0.2.5", map[string]string{"team-a": a + "bad.example", "team-b": ""}},
		// serviceEntryVisibility NONE for the untrusted namespace's entries.
		{"192.0.2.6", map[string]string{"sandbox": "", "team-b": ""}},
		{"10.96.0.1", map[string]string{"team-a": a + "web.team-a.svc.cluster.local", "team-b": a + "web.team-a.svc.cluster.local", "team-c": ""}},
		{"10.96.0.2", map[string]string{"team-a": a + "api.team-a.svc.cluster.local", "team-b": ""}},
		{"10.96.0.3", map[string]string{"team-a": "", "team-b": ""}},
	} {
		for ns, want := range r.seen {
			if got := keyOf(snap.ServiceByVIP("", netip.MustParseAddr(r.addr), ns)); got != want {
				t.Errorf("%s from namespace %s: %q, want %q", r.addr, ns, got, want)
			}
		}
	}
	st := seStatus(res, "team-a/bad")
	if st == nil || len(st.Invalid) != 1 || !strings.Contains(st.Invalid[0], "spec.exportTo[0]") || !strings.Contains(st.Message, "own namespace only") {
		t.Errorf("team-a/bad status %+v: want the exportTo refusal", st)
	}
	if st := seStatus(res, "sandbox/egress"); st == nil || st.Sent || !strings.Contains(st.Message, "visible to no namespace") {
		t.Errorf("sandbox/egress status %+v: want not sent (serviceEntryVisibility NONE)", st)
	}
	if st := seStatus(res, "team-c/private"); st != nil {
		t.Errorf("team-c/private status %+v: want none (no namespace sees both entries of 192.0.2.1)", st)
	}
}

func nodeStateOf(t *testing.T, res *Result) *state.Snapshot {
	t.Helper()
	s := state.NewStore()
	adds := map[string]*workloadapi.Address{}
	for k, a := range res.Addresses.All() {
		adds[k] = a
	}
	if err := s.ApplyAddresses(adds, nil); err != nil {
		t.Fatalf("node proxy state refuses the translation: %v", err)
	}
	return s.Load()
}
