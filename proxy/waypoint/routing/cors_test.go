package routing

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestCors: Envoy's CORS filter as Istio's corsPolicy and Gateway API's
// CORS filter use it: a request without Origin is untouched; an allowed
// preflight is answered with the Access-Control-Allow-* headers; an
// allowed request goes upstream and its response gets Allow-Origin,
// Expose-Headers and Allow-Credentials; a preflight from another origin
// goes upstream (Istio FORWARD) or is answered bare (Gateway API, Istio
// IGNORE); "*" with credentials echoes the request (Gateway API).
func TestCors(t *testing.T) {
	policy := func(unmatched waypointapi.Cors_Unmatched, creds bool, methods, headers []string) *Table {
		return Compile([]*waypointapi.Route{{Name: "r", Namespace: "ns", Rules: []*waypointapi.RouteRule{{
			Cors: &waypointapi.Cors{AllowOrigins: []string{`https://.*\.example\.com`, `http://a\.test:8080`}, AllowMethods: methods, AllowHeaders: headers,
				ExposeHeaders: []string{"X-Exposed"}, MaxAgeS: 5, AllowCredentials: creds, UnmatchedPreflight: unmatched},
			Backends: []*waypointapi.Backend{{Hostname: "b", Weight: 1}},
		}}}})
	}
	type want struct {
		answers bool
		code    int
		headers map[string]string // "" value: absent
	}
	for _, tc := range []struct {
		name   string
		tab    *Table
		method string
		hdr    map[string]string
		want   want
	}{
		{"no origin", policy(waypointapi.Cors_FORWARD, false, []string{"GET"}, nil), "GET", nil,
			want{headers: map[string]string{"Access-Control-Allow-Origin": ""}}},
		{"allowed request", policy(waypointapi.Cors_FORWARD, true, []string{"GET"}, nil), "GET", map[string]string{"Origin": "https://www.example.com"},
			want{headers: map[string]string{"Access-Control-Allow-Origin": "https://www.example.com", "Access-Control-Expose-Headers": "X-Exposed",
				"Access-Control-Allow-Credentials": "true"}}},
		{"other origin request", policy(waypointapi.Cors_FORWARD, true, []string{"GET"}, nil), "GET", map[string]string{"Origin": "https://example.org"},
			want{headers: map[string]string{"Access-Control-Allow-Origin": ""}}},
		{"port is part of the origin", policy(waypointapi.Cors_FORWARD, false, nil, nil), "GET", map[string]string{"Origin": "http://a.test"},
			want{headers: map[string]string{"Access-Control-Allow-Origin": ""}}},
		{"allowed preflight", policy(waypointapi.Cors_FORWARD, false, []string{"GET", "PUT"}, []string{"x-a", "x-b"}), "OPTIONS",
			map[string]string{"Origin": "http://a.test:8080", "Access-Control-Request-Method": "PUT"},
			want{answers: true, code: 200, headers: map[string]string{"Access-Control-Allow-Origin": "http://a.test:8080", "Access-Control-Allow-Methods": "GET,PUT",
				"Access-Control-Allow-Headers": "x-a,x-b", "Access-Control-Max-Age": "5", "Access-Control-Allow-Credentials": ""}}},
		{"wildcard with credentials echoes", policy(waypointapi.Cors_ANSWER, true, []string{"*"}, []string{"*"}), "OPTIONS",
			map[string]string{"Origin": "https://x.example.com", "Access-Control-Request-Method": "DELETE", "Access-Control-Request-Headers": "x-y"},
			want{answers: true, code: 200, headers: map[string]string{"Access-Control-Allow-Methods": "DELETE", "Access-Control-Allow-Headers": "x-y",
				"Access-Control-Allow-Credentials": "true"}}},
		{"wildcard without credentials", policy(waypointapi.Cors_ANSWER, false, []string{"*"}, nil), "OPTIONS",
			map[string]string{"Origin": "https://x.example.com", "Access-Control-Request-Method": "DELETE"},
			want{answers: true, code: 200, headers: map[string]string{"Access-Control-Allow-Methods": "*"}}},
		{"other origin preflight forwarded", policy(waypointapi.Cors_FORWARD, false, []string{"GET"}, nil), "OPTIONS",
			map[string]string{"Origin": "https://example.org", "Access-Control-Request-Method": "GET"},
			want{headers: map[string]string{"Access-Control-Allow-Origin": ""}}},
		{"other origin preflight answered", policy(waypointapi.Cors_ANSWER, false, []string{"GET"}, nil), "OPTIONS",
			map[string]string{"Origin": "https://example.org", "Access-Control-Request-Method": "GET"},
			want{answers: true, code: 200, headers: map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Allow-Methods": ""}}},
		{"OPTIONS without request method is no preflight", policy(waypointapi.Cors_ANSWER, false, []string{"GET"}, nil), "OPTIONS",
			map[string]string{"Origin": "https://www.example.com"},
			want{headers: map[string]string{"Access-Control-Allow-Origin": "https://www.example.com"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "/x", nil)
			for k, v := range tc.hdr {
				r.Header.Set(k, v)
			}
			rule, m, _ := tc.tab.pick(r, Client{}, 80)
			e := Edit{rule: rule, prefixLen: m.prefixLen}
			e.cors, e.origin = rule.cors.decide(r)
			if e.Answers() != tc.want.answers {
				t.Fatalf("Answers %v, want %v", e.Answers(), tc.want.answers)
			}
			h := http.Header{}
			if tc.want.answers {
				rec := httptest.NewRecorder()
				if code := e.Answer(rec, r, 80); code != tc.want.code {
					t.Errorf("answered %d, want %d", code, tc.want.code)
				}
				h = rec.Header()
			} else {
				e.Response(h)
			}
			for k, v := range tc.want.headers {
				if got := h.Get(k); got != v {
					t.Errorf("%s: %q, want %q", k, got, v)
				}
			}
		})
	}
}
