package translate

import "testing"

// TestCanonicalServiceLabels: the workload API's canonical_name and
// canonical_revision, which the proxies report as *_canonical_service,
// *_canonical_revision, *_app and *_version, come from the pod's labels
// in istiod's order (pkg/config/labels CanonicalService): the
// service.istio.io label, then app.kubernetes.io, then app/version, the
// first present winning; the name falls back to the workload name and the
// revision to "latest".
func TestCanonicalServiceLabels(t *testing.T) {
	cases := []struct {
		name             string
		labels           map[string]string
		wantName, wantRv string
	}{
		{"none", nil, "reviews", "latest"},
		{"app and version", map[string]string{"app": "rev", "version": "v2"}, "rev", "v2"},
		{"app.kubernetes.io over app", map[string]string{"app": "a", "app.kubernetes.io/name": "k",
			"version": "v1", "app.kubernetes.io/version": "kv"}, "k", "kv"},
		{"istio labels over all", map[string]string{"app": "a", "app.kubernetes.io/name": "k",
			"service.istio.io/canonical-name": "c", "version": "v1", "app.kubernetes.io/version": "kv",
			"service.istio.io/canonical-revision": "cr"}, "c", "cr"},
		// A label present with an empty value still wins, as in istiod:
		// the proxies then report "unknown".
		{"empty values count", map[string]string{"service.istio.io/canonical-name": "", "app": "a",
			"service.istio.io/canonical-revision": "", "version": "v1"}, "", ""},
	}
	for _, tc := range cases {
		if n, r := canonical(tc.labels, "reviews"); n != tc.wantName || r != tc.wantRv {
			t.Errorf("%s: canonical = %q, %q; want %q, %q", tc.name, n, r, tc.wantName, tc.wantRv)
		}
	}
}
