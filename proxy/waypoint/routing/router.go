package routing

import (
	"crypto/tls"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// backend is one weighted destination of a route rule.
type backend struct {
	// refused: why the control plane refused this backendRef (no
	// ReferenceGrant, unknown kind, missing object); its share is 500.
	refused             string
	hostname, namespace string
	port                uint16 // 0: the port the client addressed
	weight              uint32
	// policy: a DestinationRule subset or traffic policy (lb.go); nil:
	// the node proxy's endpoint choice. missingSubset: the subset is not
	// defined, the request answers 503.
	policy        *backendPolicy
	missingSubset string
	// reqMods and respMods: the backend's own header modifiers
	// (rewrite.go), for requests sent to it.
	reqMods, respMods []headerOps
	// tls: originate TLS to its endpoints (DestinationRule tls SIMPLE or
	// MUTUAL, tls.go); tlsErr: why that configuration is unusable (503).
	tls    *tls.Config
	tlsErr error
}

type headerMatch struct {
	name, value string
	re          *regexp.Regexp // nil: exact
}

func (h *headerMatch) match(v string, ok bool) bool {
	if !ok {
		return false
	}
	if h.re != nil {
		return h.re.MatchString(v)
	}
	return v == h.value
}

type routeMatch struct {
	pathType waypointapi.PathMatch_Type
	path     string
	pathRe   *regexp.Regexp
	headers  []headerMatch
	method   string
	query    []headerMatch
	port     uint16 // the addressed service port (0: any)
	// prefixLen is the length of the path prefix a prefix match matches
	// (without a trailing "/" for a Gateway API PathPrefix), for a prefix
	// rewrite or redirect; -1: not a prefix match.
	prefixLen int
	fold      bool // STRING_PREFIX compares case-insensitively
	invalid   bool // a regex that does not compile: never matches
	// srcNs: the client's namespace must be this one ("": any); srcSel:
	// the client's proven workload must be one of srcUIDs (VirtualService
	// sourceNamespace and sourceLabels).
	srcNs   string
	srcSel  bool
	srcUIDs map[string]bool
}

// Client is who sends a request, as far as the waypoint can prove it.
type Client struct {
	// Namespace is that of the client's verified peer identity ("":
	// none); consumer routes and sourceNamespace are matched against it.
	Namespace string
	// WorkloadUID is the uid of the workload at the client's address when
	// that workload's identity is the peer certificate's ("": not proven,
	// so no sourceLabels match holds).
	WorkloadUID string
}

// mirror is one RequestMirror of a rule: a backend and the percent of
// requests copied to it.
type mirror struct {
	backend backend
	percent uint64
}

// Rule is one compiled route rule.
type Rule struct {
	mirrors []mirror
	route   string // ns/name
	// clientNs: a consumer route's namespace, the only one whose clients
	// it applies to ("": a producer route, every client).
	clientNs string
	// ports the route is scoped to (parentRefs port/sectionName); nil:
	// every port.
	ports   []uint32
	matches []routeMatch
	// reqMods and respMods: the rule's header modifiers; rewrite, redirect
	// and direct: its URL rewrite and own answers (rewrite.go).
	reqMods, respMods []headerOps
	rewrite           *rewrite
	redirect          *redirect
	direct            *directResponse
	cors              *cors // its CORS policy (cors.go)
	backends          []backend
	total             uint64
	timeout           time.Duration
	retries           int
	perTry            time.Duration
	retryOn           map[int]bool
	fault             *compiledFault // VirtualService fault injection (fault.go)
}

// Table is the compiled HTTPRoutes of one service, in precedence
// order of their rules (oldest route first, then rule order).
type Table struct {
	rules []*Rule
	// firstMatch: VirtualService rules, which Istio evaluates in order
	// (the first matching rule wins), not by Gateway API specificity.
	firstMatch bool
	// scoped: some rule is a consumer route's or port-scoped, so each
	// request first selects the rules that apply to it (applicable).
	scoped bool
}

// Compile compiles a service's routes (nil: none, the service itself
// takes its requests).
func Compile(routes []*waypointapi.Route) *Table {
	if len(routes) == 0 {
		return nil
	}
	t := &Table{}
	for _, r := range routes {
		t.firstMatch = t.firstMatch || r.GetKind() == "VirtualService"
		for _, rr := range r.GetRules() {
			cr := &Rule{route: r.GetNamespace() + "/" + r.GetName(), fault: compileFault(rr.GetFault()),
				clientNs: r.GetClientNamespace(), ports: r.GetPorts(),
				reqMods: compileHeaderOps(rr.GetRequestHeaderModifiers()), respMods: compileHeaderOps(rr.GetResponseHeaderModifiers())}
			// A filter that cannot be compiled (a bad regex, a bad status)
			// makes the rule answer 500: it must not be skipped.
			broken := false
			if rw := rr.GetRewrite(); rw != nil {
				pm, ok := compilePathModifier(rw.GetPath())
				cr.rewrite, broken = &rewrite{path: pm, host: rw.GetHost()}, !ok
			}
			if rd, ok := compileRedirect(rr.GetRedirect()); !ok {
				broken = true
			} else {
				cr.redirect = rd
			}
			if c, ok := compileCors(rr.GetCors()); !ok {
				broken = true
			} else {
				cr.cors = c
			}
			if d := rr.GetDirectResponse(); d != nil && cr.redirect == nil {
				cr.direct = &directResponse{code: int(d.GetStatus()), body: d.GetBody()}
				if cr.direct.code < 200 || cr.direct.code > 599 {
					cr.direct, broken = nil, true
				}
			}
			t.scoped = t.scoped || cr.clientNs != "" || len(cr.ports) > 0
			for _, m := range rr.GetMatches() {
				cm := routeMatch{pathType: m.GetPath().GetType(), path: m.GetPath().GetValue(), method: m.GetMethod(),
					port: uint16(m.GetPort()), fold: m.GetPath().GetIgnoreCase(), prefixLen: -1}
				if m.GetPath() == nil {
					cm.path = "/"
				}
				cm.srcNs = m.GetSourceNamespace()
				if sw := m.GetSourceWorkloads(); sw != nil {
					cm.srcSel, cm.srcUIDs = true, make(map[string]bool, len(sw.GetUids()))
					for _, uid := range sw.GetUids() {
						cm.srcUIDs[uid] = true
					}
				}
				switch cm.pathType {
				case waypointapi.PathMatch_REGULAR_EXPRESSION:
					re, err := regexp.Compile("^(?:" + cm.path + ")$")
					cm.pathRe, cm.invalid = re, err != nil
				case waypointapi.PathMatch_PATH_PREFIX:
					cm.prefixLen = len(strings.TrimSuffix(cm.path, "/"))
				case waypointapi.PathMatch_STRING_PREFIX:
					cm.prefixLen = len(cm.path)
				}
				for _, h := range m.GetHeaders() {
					hm, ok := compileHeaderMatch(h)
					cm.invalid = cm.invalid || !ok
					cm.headers = append(cm.headers, hm)
				}
				for _, q := range m.GetQueryParams() {
					qm, ok := compileHeaderMatch(q)
					cm.invalid = cm.invalid || !ok
					cm.query = append(cm.query, qm)
				}
				cr.matches = append(cr.matches, cm)
			}
			if len(cr.matches) == 0 {
				cr.matches = []routeMatch{{path: "/"}}
			}
			for _, b := range rr.GetBackends() {
				cb := backend{hostname: b.GetHostname(), namespace: b.GetNamespace(), port: uint16(b.GetPort()), weight: b.GetWeight(),
					policy: compileBackendPolicy(b), refused: b.GetRefused(),
					reqMods: compileHeaderOps(b.GetRequestHeaderModifiers()), respMods: compileHeaderOps(b.GetResponseHeaderModifiers())}
				if b.GetMissingSubset() {
					cb.missingSubset = b.GetSubset()
				}
				cb.tls, cb.tlsErr = compileTLS(b.GetTrafficPolicy().GetTls(), b.GetHostname())
				cr.backends = append(cr.backends, cb)
				cr.total += uint64(b.GetWeight())
			}
			for _, m := range rr.GetMirrors() {
				b := m.GetBackend()
				if b.GetRefused() != "" {
					continue // no copy to a backend the control plane refused
				}
				mb := backend{hostname: b.GetHostname(), namespace: b.GetNamespace(), port: uint16(b.GetPort()), policy: compileBackendPolicy(b)}
				if b.GetMissingSubset() {
					mb.missingSubset = b.GetSubset()
				}
				cr.mirrors = append(cr.mirrors, mirror{
					backend: mb,
					percent: uint64(min(m.GetPercent(), 100)),
				})
			}
			if broken {
				cr.rewrite, cr.redirect, cr.direct, cr.cors, cr.backends, cr.total = nil, nil, nil, nil, nil, 0
			}
			cr.timeout = time.Duration(rr.GetTimeoutMs()) * time.Millisecond
			if rt := rr.GetRetry(); rt != nil {
				cr.retries = int(rt.GetAttempts())
				cr.perTry = time.Duration(rt.GetPerTryTimeoutMs()) * time.Millisecond
				cr.retryOn = map[int]bool{}
				for _, c := range rt.GetCodes() {
					cr.retryOn[int(c)] = true
				}
				if len(cr.retryOn) == 0 {
					cr.retryOn[http.StatusServiceUnavailable] = true
				}
			}
			t.rules = append(t.rules, cr)
		}
	}
	return t
}

func compileHeaderMatch(h *waypointapi.HeaderMatch) (headerMatch, bool) {
	hm := headerMatch{name: h.GetName(), value: h.GetValue()}
	if h.GetRegex() {
		// Envoy's safe_regex (RE2) matches the whole value, as Gateway
		// API's RegularExpression is read by Istio: "v1" must not match
		// "xv1y".
		re, err := regexp.Compile("^(?:" + h.GetValue() + ")$")
		if err != nil {
			return hm, false
		}
		hm.re = re
	}
	return hm, true
}

// from reports whether the request's client is one this match is for.
func (m *routeMatch) from(c Client) bool {
	if m.srcNs != "" && c.Namespace != m.srcNs {
		return false
	}
	return !m.srcSel || c.WorkloadUID != "" && m.srcUIDs[c.WorkloadUID]
}

func (m *routeMatch) matches(r *http.Request) bool {
	if m.invalid {
		return false
	}
	p := r.URL.Path
	switch m.pathType {
	case waypointapi.PathMatch_STRING_PREFIX:
		if len(p) < len(m.path) || !(p[:len(m.path)] == m.path || m.fold && strings.EqualFold(p[:len(m.path)], m.path)) {
			return false
		}
	case waypointapi.PathMatch_EXACT:
		if p != m.path {
			return false
		}
	case waypointapi.PathMatch_REGULAR_EXPRESSION:
		if !m.pathRe.MatchString(p) {
			return false
		}
	default:
		// Gateway API prefix: element-wise ("/api" matches /api and /api/x,
		// not /apix).
		pre := strings.TrimSuffix(m.path, "/")
		if !(p == pre || strings.HasPrefix(p, pre+"/") || pre == "") {
			return false
		}
	}
	if m.method != "" && r.Method != m.method {
		return false
	}
	for i := range m.headers {
		vs := r.Header.Values(m.headers[i].name)
		if len(vs) == 0 && strings.EqualFold(m.headers[i].name, "host") {
			vs = []string{r.Host}
		}
		v := strings.Join(vs, ",")
		if !m.headers[i].match(v, len(vs) > 0) {
			return false
		}
	}
	if len(m.query) > 0 {
		q := r.URL.Query()
		for i := range m.query {
			vs, ok := q[m.query[i].name]
			v := ""
			if ok && len(vs) > 0 {
				v = vs[0]
			}
			if !m.query[i].match(v, ok) {
				return false
			}
		}
	}
	return true
}

// specificity orders matches as Gateway API does: exact path, then the
// longest path, then a method, then more headers, then more query params.
func (m *routeMatch) specificity() [5]int {
	exact := 0
	if m.pathType == waypointapi.PathMatch_EXACT {
		exact = 1
	}
	method := 0
	if m.method != "" {
		method = 1
	}
	return [5]int{exact, len(m.path), method, len(m.headers), len(m.query)}
}

func less(a, b [5]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// applicable selects the routes that apply to a request from a client in
// namespace clientNs (from its peer identity) to port, as Gateway API's
// mesh binding says: routes not scoped to another port; of those, the
// consumer routes of the client's namespace when there are any (they
// replace the producer routes for that namespace's clients), else the
// producer routes. Never a consumer route of another namespace: a route
// a tenant writes for someone else's Service affects only that tenant's
// own clients.
func (t *Table) applicable(rule *Rule, clientNs string, port uint16, consumer bool) bool {
	if len(rule.ports) > 0 && !slices.Contains(rule.ports, uint32(port)) {
		return false
	}
	if consumer {
		return rule.clientNs == clientNs
	}
	return rule.clientNs == ""
}

// pick returns the rule for r from client c to port: among the applicable rules, the most specific matching match,
// ties to the earlier rule (VirtualService rules: the first that
// matches). nil with routed true: no applicable rule matches (404); routed
// false: no route applies to this request at all (the service itself
// takes it).
func (t *Table) pick(r *http.Request, c Client, port uint16) (best *Rule, bestMatch *routeMatch, routed bool) {
	clientNs := c.Namespace
	consumer := false
	if t.scoped {
		for _, rule := range t.rules {
			if clientNs != "" && rule.clientNs == clientNs && t.applicable(rule, clientNs, port, true) {
				consumer = true
				break
			}
		}
	}
	var bestSpec [5]int
	for _, rule := range t.rules {
		if t.scoped && !t.applicable(rule, clientNs, port, consumer) {
			continue
		}
		routed = true
		for i := range rule.matches {
			m := &rule.matches[i]
			if m.port != 0 && m.port != port || !m.matches(r) || !m.from(c) {
				continue
			}
			if t.firstMatch {
				return rule, m, true
			}
			if s := m.specificity(); best == nil || less(bestSpec, s) {
				best, bestMatch, bestSpec = rule, m, s
			}
		}
	}
	return best, bestMatch, routed
}

// choose picks a backend by weight with n a random number in [0, total).
func (r *Rule) choose(n uint64) (*backend, bool) {
	if r.total == 0 {
		return nil, false
	}
	n %= r.total
	for i := range r.backends {
		b := &r.backends[i]
		if n < uint64(b.weight) {
			return b, true
		}
		n -= uint64(b.weight)
	}
	return nil, false
}

// Route names the route the rule is of ("ns/name").
func (r *Rule) Route() string { return r.route }

// Timeout is the request timeout (0: none), from the client's request to
// the end of the upstream response head, retries included.
func (r *Rule) Timeout() time.Duration { return r.timeout }

// Retries is how many times more a request may be sent upstream; PerTry
// bounds each attempt (0: no bound); RetryOn reports whether an answer with
// code is retried.
func (r *Rule) Retries() int          { return r.retries }
func (r *Rule) PerTry() time.Duration { return r.perTry }
func (r *Rule) RetryOn(code int) bool { return r.retryOn[code] }

// HasFault reports whether the rule injects faults; HasMirrors whether it
// mirrors requests.
func (r *Rule) HasFault() bool   { return r.fault != nil }
func (r *Rule) HasMirrors() bool { return len(r.mirrors) > 0 }
