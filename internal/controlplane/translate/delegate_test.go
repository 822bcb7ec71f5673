package translate

import (
	"slices"
	"strings"
	"testing"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

func vsDoc(ns, name, spec string) string {
	return "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: " + name + ", namespace: " + ns +
		", creationTimestamp: \"2026-01-01T00:00:00Z\"}\nspec:\n" + spec + "\n"
}

// ruleSummary is "path-match backend/subset, ..." of each rule, for
// comparisons: "500" for a rule without backends.
func ruleSummary(rules []*waypointapi.RouteRule) []string {
	var out []string
	for _, rr := range rules {
		var ms, bs []string
		for _, m := range rr.GetMatches() {
			s := m.GetPath().GetValue()
			for _, h := range m.GetHeaders() {
				s += " " + h.GetName() + "=" + h.GetValue()
			}
			ms = append(ms, s)
		}
		for _, b := range rr.GetBackends() {
			bs = append(bs, strings.TrimSuffix(b.GetHostname(), ".svc.cluster.local")+"/"+b.GetSubset())
		}
		if len(bs) == 0 && rr.GetDirectResponse() == nil && rr.GetRedirect() == nil {
			bs = []string{"500"}
		}
		out = append(out, "["+strings.Join(ms, "|")+"] "+strings.Join(bs, ","))
	}
	return out
}

// TestVirtualServiceDelegate: a root rule that delegates becomes the
// delegate's rules, in order, each with its matches narrowed by the
// root's and the root's timeout where it sets none; a delegate rule whose
// match falls outside the root's is dropped and both statuses say so; a
// delegate's short hosts are its own namespace's, the root's mirror the
// root's; the delegate's status says who uses it.
func TestVirtualServiceDelegate(t *testing.T) {
	c, sts := bookinfoConfig(t,
		vsDoc("default", "reviews", `  hosts: [reviews]
  http:
  - name: v2
    match: [{uri: {prefix: /v2}}]
    timeout: 3s
    mirror: {host: ratings}
    delegate: {name: reviews-v2, namespace: team}
  - route: [{destination: {host: reviews, subset: v1}}]`),
		vsDoc("team", "reviews-v2", `  exportTo: [default]
  http:
  - match: [{uri: {prefix: /v2/api}, headers: {x-user: {exact: jason}}}]
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v2}}]
  - match: [{uri: {exact: /v2/ratings}}]
    timeout: 1s
    route: [{destination: {host: ratings}}]
  - match: [{uri: {prefix: /other}}]
    route: [{destination: {host: reviews.default.svc.cluster.local, subset: v3}}]
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v3}}]`))
	r := serviceRoutes(t, c, "reviews")
	if len(r) != 1 {
		t.Fatalf("routes %v", r)
	}
	got := ruleSummary(r[0].GetRules())
	want := []string{
		"[/v2/api x-user=jason] reviews.default/v2",
		"[/v2/ratings] ratings.team/",
		"[/v2] reviews.default/v3",
		"[] reviews.default/v1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rules\n got %q\nwant %q", got, want)
	}
	rules := r[0].GetRules()
	if rules[0].GetTimeoutMs() != 3000 || rules[1].GetTimeoutMs() != 1000 {
		t.Errorf("timeouts %d %d: the delegate's own, else the root's", rules[0].GetTimeoutMs(), rules[1].GetTimeoutMs())
	}
	if m := rules[0].GetMirrors(); len(m) != 1 || m[0].GetBackend().GetHostname() != "ratings.default.svc.cluster.local" {
		t.Errorf("mirror %v: the root's short host is the root's namespace's", m)
	}
	root := statusOf(sts, kindVS, "default/reviews")
	if len(root.Invalid) > 0 || !strings.Contains(root.Message, "delegate(team/reviews-v2).http[2]: its matches do not fall within") {
		t.Errorf("root status %+v", root)
	}
	del := statusOf(sts, kindVS, "team/reviews-v2")
	if !del.Sent || !strings.Contains(del.Message, "delegate of VirtualService default/reviews") {
		t.Errorf("delegate status %+v", del)
	}
}

// TestVirtualServiceDelegateAttacks: what a tenant (namespace evil) can
// try with delegation, and what the waypoint of namespace default does.
func TestVirtualServiceDelegateAttacks(t *testing.T) {
	rootReviews := func(delegate string) string {
		return vsDoc("default", "reviews", `  hosts: [reviews]
  http:
  - match: [{uri: {prefix: /api}}]
    delegate: `+delegate+`
  - route: [{destination: {host: reviews, subset: v1}}]`)
	}
	ownDelegate := vsDoc("default", "reviews-api", `  http: [{route: [{destination: {host: reviews, subset: v2}}]}]`)
	evilService := `---
apiVersion: v1
kind: Service
metadata: {name: sink, namespace: evil}
spec: {selector: {app: sink}, clusterIP: 10.96.0.66, ports: [{name: http, port: 9080}]}
`
	for _, tc := range []struct {
		name     string
		docs     []string
		want     []string // reviews' rules (ruleSummary)
		object   string   // whose status to check
		sent     bool
		invalid  string // a substring of an invalid entry ("": none)
		evilSent bool   // whether evil's VirtualService applied anywhere
	}{{
		// evil names its own hostless VirtualService like default's
		// delegate: a delegate without a namespace is the root's own.
		name: "squat the delegate's name",
		docs: []string{evilService, rootReviews("{name: reviews-api}"), ownDelegate,
			vsDoc("evil", "reviews-api", `  http: [{route: [{destination: {host: sink.evil.svc.cluster.local}}]}]`)},
		want:   []string{"[/api] reviews.default/v2", "[] reviews.default/v1"},
		object: "default/reviews", sent: true,
	}, {
		// A hostless VirtualService nobody names applies to nothing.
		name:   "write a delegate nobody names",
		docs:   []string{evilService, rootReviews("{name: reviews-api}"), ownDelegate, vsDoc("evil", "grab", `  http: [{route: [{destination: {host: sink.evil.svc.cluster.local}}]}]`)},
		want:   []string{"[/api] reviews.default/v2", "[] reviews.default/v1"},
		object: "default/reviews", sent: true,
	}, {
		// evil's own root for default's host (exported to default by the
		// mesh default "*") borrows default's delegate, which default
		// exported to itself only: refused, and the rule answers 500.
		name: "delegate to someone else's unexported delegate",
		docs: []string{rootReviews("{name: reviews-api}"),
			vsDoc("default", "reviews-api", `  exportTo: ["."]
  http: [{route: [{destination: {host: reviews, subset: v2}}]}]`),
			vsDoc("evil", "borrow", `  hosts: [reviews.default.svc.cluster.local]
  http:
  - match: [{headers: {x-evil: {exact: "1"}}}]
    delegate: {name: reviews-api, namespace: default}`)},
		want:   []string{"[/api] reviews.default/v2", "[] reviews.default/v1", "[ x-evil=1] 500"},
		object: "evil/borrow", sent: true, invalid: "spec.http[0].delegate: delegate default/reviews-api is not exported to namespace evil",
		evilSent: true,
	}, {
		// A VirtualService with hosts is never a delegate: naming one
		// does not pull its rules in.
		name: "name a root as the delegate",
		docs: []string{evilService, rootReviews("{name: rules, namespace: evil}"), vsDoc("evil", "rules", `  hosts: [sink]
  http: [{route: [{destination: {host: sink}}]}]`)},
		want:   []string{"[/api] 500", "[] reviews.default/v1"},
		object: "default/reviews", sent: true, invalid: "VirtualService evil/rules has hosts: it is a root, not a delegate",
	}, {
		// A delegate that is gone answers 500 instead of letting /api
		// fall through to the catch-all (where Istio drops the rule).
		name:   "withdraw the delegate",
		docs:   []string{rootReviews("{name: reviews-api, namespace: evil}")},
		want:   []string{"[/api] 500", "[] reviews.default/v1"},
		object: "default/reviews", sent: true, invalid: "VirtualService evil/reviews-api does not exist",
	}, {
		// Delegation is one level: a delegate's rule that delegates again
		// answers 500.
		name: "delegate again",
		docs: []string{evilService, rootReviews("{name: reviews-api, namespace: evil}"), vsDoc("evil", "reviews-api", `  http:
  - match: [{uri: {prefix: /api/x}}]
    delegate: {name: deeper}
  - route: [{destination: {host: reviews.default.svc.cluster.local, subset: v3}}]`),
			vsDoc("evil", "deeper", `  http: [{route: [{destination: {host: sink}}]}]`)},
		want:   []string{"[/api/x] 500", "[/api] reviews.default/v3", "[] reviews.default/v1"},
		object: "default/reviews", sent: true, invalid: "delegate(evil/reviews-api).http[0].delegate: a delegate's rule cannot delegate again",
		evilSent: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, sts := bookinfoConfig(t, tc.docs...)
			var got []string
			for _, r := range serviceRoutes(t, c, "reviews") {
				got = append(got, ruleSummary(r.GetRules())...)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("reviews rules\n got %q\nwant %q", got, tc.want)
			}
			st := statusOf(sts, kindVS, tc.object)
			if st.Sent != tc.sent {
				t.Errorf("%s sent %v, want %v: %+v", tc.object, st.Sent, tc.sent, st)
			}
			if inv := strings.Join(st.Invalid, "; "); tc.invalid != "" && !strings.Contains(inv, tc.invalid) || tc.invalid == "" && inv != "" {
				t.Errorf("%s invalid %q, want %q", tc.object, inv, tc.invalid)
			}
			for _, s := range sts {
				if s.Kind == kindVS && strings.HasPrefix(s.Name, "evil/") && s.Sent && !tc.evilSent {
					t.Errorf("evil's %s applied: %+v", s.Name, s)
				}
			}
		})
	}
}

// TestDelegateMatchMerge: Istio's rules for a delegate match within a root
// match, one condition at a time.
func TestDelegateMatchMerge(t *testing.T) {
	exact := func(s string) *networkingv1alpha3.StringMatch {
		return &networkingv1alpha3.StringMatch{MatchType: &networkingv1alpha3.StringMatch_Exact{Exact: s}}
	}
	prefix := func(s string) *networkingv1alpha3.StringMatch {
		return &networkingv1alpha3.StringMatch{MatchType: &networkingv1alpha3.StringMatch_Prefix{Prefix: s}}
	}
	regex := func(s string) *networkingv1alpha3.StringMatch {
		return &networkingv1alpha3.StringMatch{MatchType: &networkingv1alpha3.StringMatch_Regex{Regex: s}}
	}
	type m = networkingv1alpha3.HTTPMatchRequest
	for _, tc := range []struct {
		name        string
		root, sub   *m
		contradicts bool
	}{
		{"prefix within prefix", &m{Uri: prefix("/a")}, &m{Uri: prefix("/a/b")}, false},
		{"prefix outside prefix", &m{Uri: prefix("/a/b")}, &m{Uri: prefix("/a")}, true},
		{"exact within prefix", &m{Uri: prefix("/a")}, &m{Uri: exact("/a/x")}, false},
		{"prefix under exact", &m{Uri: exact("/a")}, &m{Uri: prefix("/a")}, true},
		{"other exact", &m{Uri: exact("/a")}, &m{Uri: exact("/b")}, true},
		{"regex root", &m{Uri: regex("/a.*")}, &m{Uri: prefix("/a")}, true},
		{"regex delegate", &m{Uri: prefix("/a")}, &m{Uri: regex("/a.*")}, true},
		{"unset delegate uri", &m{Uri: prefix("/a")}, &m{Method: exact("GET")}, false},
		{"other header value", &m{Headers: map[string]*networkingv1alpha3.StringMatch{"x": exact("1")}},
			&m{Headers: map[string]*networkingv1alpha3.StringMatch{"x": exact("2")}}, true},
		{"ignoreUriCase differs", &m{IgnoreUriCase: true}, &m{}, true},
		{"other port", &m{Port: 80}, &m{Port: 81}, true},
		{"sourceNamespace unset in delegate", &m{SourceNamespace: "a"}, &m{}, true},
		{"sourceNamespace same", &m{SourceNamespace: "a"}, &m{SourceNamespace: "a"}, false},
		{"sourceNamespace narrows", &m{}, &m{SourceNamespace: "a"}, false},
		{"sourceLabels other value", &m{SourceLabels: map[string]string{"app": "a"}}, &m{SourceLabels: map[string]string{"app": "b"}}, true},
		{"sourceLabels more", &m{SourceLabels: map[string]string{"app": "a"}}, &m{SourceLabels: map[string]string{"v": "1"}}, false},
		{"gateways not a subset", &m{Gateways: []string{"mesh"}}, &m{Gateways: []string{"mesh", "gw"}}, true},
	} {
		if got := matchesContradict(tc.root, tc.sub); got != tc.contradicts {
			t.Errorf("%s: contradicts %v, want %v", tc.name, got, tc.contradicts)
		}
	}
	// Merging fills what the delegate leaves unset from the root.
	merged := mergeMatch(&m{Uri: prefix("/a"), SourceNamespace: "shop", SourceLabels: map[string]string{"app": "a"}},
		&m{Method: exact("GET"), SourceLabels: map[string]string{"v": "1"}})
	if merged.GetUri().GetPrefix() != "/a" || merged.GetMethod().GetExact() != "GET" || merged.GetSourceNamespace() != "shop" ||
		len(merged.GetSourceLabels()) != 2 {
		t.Errorf("merged %v", merged)
	}
}

// TestVirtualServiceSourceMatch: sourceLabels become the uids of the
// workloads they select (none: an empty, non-nil list that matches
// nobody); sourceNamespace is passed on; an invalid label or namespace
// fails closed.
func TestVirtualServiceSourceMatch(t *testing.T) {
	c, sts := bookinfoConfig(t, bookinfoPod("productpage-v1", "productpage", "v1", "10.0.0.9"),
		vsDoc("default", "reviews", `  hosts: [reviews]
  http:
  - match: [{sourceLabels: {app: productpage}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - match: [{sourceLabels: {app: nobody}}]
    route: [{destination: {host: reviews, subset: v3}}]
  - match: [{sourceNamespace: team}]
    route: [{destination: {host: reviews, subset: v3}}]
  - route: [{destination: {host: reviews, subset: v1}}]`),
		vsDoc("default", "ratings", `  hosts: [ratings]
  http:
  - match: [{sourceLabels: {"bad key!": x}}, {sourceNamespace: "Not_A_Namespace"}]
    route: [{destination: {host: ratings}}]`))
	rules := serviceRoutes(t, c, "reviews")[0].GetRules()
	sw := rules[0].GetMatches()[0].GetSourceWorkloads()
	if len(sw.GetUids()) != 1 || !strings.HasSuffix(sw.GetUids()[0], "/Pod/default/productpage-v1") || sw.GetLabels()["app"] != "productpage" {
		t.Errorf("sourceLabels app=productpage: %v", sw)
	}
	if sw := rules[1].GetMatches()[0].GetSourceWorkloads(); sw == nil || len(sw.GetUids()) != 0 {
		t.Errorf("sourceLabels app=nobody: %v, want a selector with no workload", sw)
	}
	if ns := rules[2].GetMatches()[0].GetSourceNamespace(); ns != "team" {
		t.Errorf("sourceNamespace %q", ns)
	}
	if st := statusOf(sts, kindVS, "default/reviews"); len(st.Invalid) > 0 || !st.Sent {
		t.Errorf("reviews status %+v", st)
	}
	if r := serviceRoutes(t, c, "ratings")[0].GetRules()[0]; len(r.GetBackends()) != 0 {
		t.Errorf("ratings rule %v: invalid source matches must answer 500", r)
	}
	st := statusOf(sts, kindVS, "default/ratings")
	if inv := strings.Join(st.Invalid, "; "); !strings.Contains(inv, "spec.http[0].match[0].sourceLabels[bad key!]") ||
		!strings.Contains(inv, "spec.http[0].match[1].sourceNamespace") {
		t.Errorf("ratings invalid %q", inv)
	}
}
