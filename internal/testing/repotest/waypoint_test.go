package repotest

import (
	"sort"
	"strings"
	"testing"
)

// The waypoint (proxy/waypoint) is split along its filter chain, as Envoy's
// filters are separate: each stage is a package under proxy/waypoint, and
// the root package assembles the chain and keeps the listeners. A stage
// never links another one; what they tell each other travels in the shared
// packages. Packages below a stage (authn/authntest) belong to it.
var (
	waypointRoot    = "proxy/waypoint"
	waypointFilters = map[string]string{
		"authn":     "authentication: RequestAuthentication (JWT)",
		"authz":     "authorization: AuthorizationPolicy",
		"routing":   "routing: routes, subsets, load balancing, outlier detection, fault injection, mirroring",
		"telemetry": "stats: istio_* metrics and the access log",
		"h1":        "the HTTP/1.1 fast path, downstream side",
		"upstream":  "the HTTP/1.1 fast path's upstream connections",
		"pathnorm":  "path normalization: the mesh's pathNormalization, before every other step",
	}
	waypointShared = map[string]string{
		"stream": "what filters tell each other about one request (attributes, authentication, verdict, refusal)",
		"wire":   "HTTP/1.1 text and buffers, written by h1 and upstream",
	}
)

// waypointRoom is the folder under proxy/waypoint that rel (relative to the
// module) sits in; "" for the root package or a path outside the waypoint.
func waypointRoom(rel string) string {
	if !strings.HasPrefix(rel, waypointRoot+"/") {
		return ""
	}
	return strings.SplitN(strings.TrimPrefix(rel, waypointRoot+"/"), "/", 2)[0]
}

// TestWaypointFilterRooms fails when a waypoint filter package links
// another filter package, when a shared package links a filter package,
// or when a package under proxy/waypoint is in neither list (say which it
// is: a new filter stage, or something every stage may use).
func TestWaypointFilterRooms(t *testing.T) {
	pkgs := goList(t)
	var ours []string
	for p := range pkgs {
		if strings.HasPrefix(p, module+"/"+waypointRoot+"/") {
			ours = append(ours, p)
		}
	}
	sort.Strings(ours)
	if len(ours) == 0 {
		t.Fatalf("no package under %s: update this test with the waypoint's layout", waypointRoot)
	}
	for _, p := range ours {
		room := waypointRoom(rel(p))
		_, filter := waypointFilters[room]
		_, shared := waypointShared[room]
		if !filter && !shared {
			t.Errorf("%s: %s/%s is neither a filter stage (waypointFilters) nor shared by them (waypointShared)", rel(p), waypointRoot, room)
			continue
		}
		var bad []string
		for d := range deps(pkgs, p) {
			if !strings.HasPrefix(d, module+"/") {
				continue
			}
			dr := waypointRoom(rel(d))
			if _, ok := waypointFilters[dr]; ok && dr != room {
				bad = append(bad, rel(d))
			}
			if rel(d) == waypointRoot {
				bad = append(bad, rel(d))
			}
		}
		sort.Strings(bad)
		for _, d := range bad {
			if filter {
				t.Errorf("%s links %s: a filter stage never links another stage or the chain; move what they share to %s/stream", rel(p), d, waypointRoot)
			} else {
				t.Errorf("%s links %s: a shared package links no filter stage", rel(p), d)
			}
		}
	}
}
