package resolve

import "testing"

func TestKubeExpansions(t *testing.T) {
	const d, sd, nd = "cluster.local", "svc.cluster.local", "ns.svc.cluster.local"
	tests := []struct {
		name string
		want [2]string
	}{
		{"a", [2]string{"a.ns.svc.cluster.local"}},
		{"a.b", [2]string{"a.b.svc.cluster.local", "a.b.ns.svc.cluster.local"}},
		{"a.b.svc", [2]string{"a.b.svc.cluster.local", "a.b.svc.svc.cluster.local"}},
		{"a.b.c", [2]string{"a.b.c.svc.cluster.local"}},
		{"a.b.c.svc", [2]string{"a.b.c.svc.cluster.local"}},
		{"a.b.c.d", [2]string{}},
		{"a.b.c.d.svc", [2]string{}},
	}
	for _, tc := range tests {
		if got := kubeExpansions(tc.name, d, sd, nd); got != tc.want {
			t.Errorf("kubeExpansions(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
