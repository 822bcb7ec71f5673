package waypoint

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TestNormalizeBeforeFilters: on both paths (the HTTP/1.1 fast path and
// net/http's), the waypoint refuses a lower-case method and %00, normalizes
// the path before authorization and forwards the normalized path, and never
// forwards the client's X-Forwarded-Client-Cert.
func TestNormalizeBeforeFilters(t *testing.T) {
	backend, _ := goBackend(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "uri=%s xfcc=%q", r.RequestURI, r.Header.Get("X-Forwarded-Client-Cert"))
	})
	deny := &waypointapi.Policy{Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}}}
	for _, slow := range []bool{false, true} {
		for _, mode := range []waypointapi.PathNormalization{waypointapi.PathNormalization_PATH_NORMALIZATION_DEFAULT, waypointapi.PathNormalization_PATH_NORMALIZATION_NONE} {
			t.Run(fmt.Sprintf("slow=%v %s", slow, mode), func(t *testing.T) {
				cfg := baseConfig(deny)
				cfg.PathNormalization = mode
				l := newFastLabWith(t, cfg, backend, slow)
				req := func(method, target, extra string) (int, string) {
					resp, body := l.rawClient(t).do(method+" "+target+" HTTP/1.1\r\nHost: "+host+"\r\n"+extra+"Connection: close\r\n\r\n", method)
					return resp.StatusCode, body
				}
				none := mode == waypointapi.PathNormalization_PATH_NORMALIZATION_NONE
				for _, p := range []string{"/public/../admin/x", "/public/%2e%2e/admin/x", "/./admin/x"} {
					code, body := req("GET", p, "")
					switch {
					case !none && code != http.StatusForbidden:
						t.Errorf("GET %s = %d %q, want 403 (normalized to /admin/x)", p, code, body)
					case none && (code != http.StatusOK || !strings.HasPrefix(body, "uri="+p+" ")):
						t.Errorf("GET %s under NONE = %d %q, want 200 with the path as sent", p, code, body)
					}
				}
				if code, body := req("GET", "/public/./a/../x?q=/../y", ""); code != http.StatusOK ||
					!none && !strings.HasPrefix(body, "uri=/public/x?q=/../y ") {
					t.Errorf("GET /public/./a/../x = %d %q, want 200 and the normalized path forwarded", code, body)
				}
				if code, body := req("GET", "/", "X-Forwarded-Client-Cert: By=spiffe://evil;URI=spiffe://cluster.local/ns/x/sa/admin\r\n"); code != http.StatusOK || !strings.Contains(body, `xfcc=""`) {
					t.Errorf("client XFCC: %d %q, want 200 and no X-Forwarded-Client-Cert at the backend", code, body)
				}
				if code, body := req("delete", "/", ""); code != http.StatusBadRequest {
					t.Errorf("delete / = %d %q, want 400 (a method that is not upper case)", code, body)
				}
				if code, body := req("GET", "/public%00", ""); code != http.StatusBadRequest {
					t.Errorf("GET /public%%00 = %d %q, want 400", code, body)
				}
			})
		}
	}
}
