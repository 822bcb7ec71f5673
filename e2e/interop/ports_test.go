package interop

import "testing"

// TestPortsGap pins what the "appProtocol TCP and TLS" entry may hide: only
// TCP/TLS on istiod's side and a defaulted target port, nothing else.
func TestPortsGap(t *testing.T) {
	port := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name         string
		istiod, ours []any
		want         bool
	}{
		{"tls and default target", []any{port("app_protocol", "TLS", "service_port", 443.0, "target_port", 443.0)}, []any{port("service_port", 443.0)}, true},
		{"tcp", []any{port("app_protocol", "TCP", "service_port", 22.0, "target_port", 22.0)}, []any{port("service_port", 22.0, "target_port", 22.0)}, true},
		{"other target port", []any{port("service_port", 80.0, "target_port", 8080.0)}, []any{port("service_port", 80.0)}, false},
		{"http lost", []any{port("app_protocol", "HTTP11", "service_port", 80.0, "target_port", 80.0)}, []any{port("service_port", 80.0)}, false},
		{"tls on our side only", []any{port("service_port", 443.0, "target_port", 443.0)}, []any{port("app_protocol", "TLS", "service_port", 443.0)}, false},
		{"port missing", []any{port("service_port", 80.0, "target_port", 80.0), port("service_port", 81.0, "target_port", 81.0)}, []any{port("service_port", 80.0)}, false},
	} {
		if got := portsGap(difference{Istiod: c.istiod, Ours: c.ours}); got != c.want {
			t.Errorf("%s: portsGap = %v, want %v", c.name, got, c.want)
		}
	}
}
