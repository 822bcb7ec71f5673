package routing

import (
	"net"
	"net/http"
	"net/textproto"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// What a rule does to a request besides picking its backend: header
// modifiers (on the request and on the response, the rule's and the picked
// backend's), a URL rewrite (path and host), and the answers it gives
// itself instead of routing: a redirect or a direct response.

// headerOps is one compiled HeaderModifier: names canonical, in a fixed
// order (set, add, remove), so applying it allocates only the values.
type headerOps struct {
	set, add [][2]string
	remove   []string
}

func compileHeaderOps(ms []*waypointapi.HeaderModifier) []headerOps {
	var out []headerOps
	for _, m := range ms {
		var ops headerOps
		for _, k := range sortedKeys(m.GetSet()) {
			ops.set = append(ops.set, [2]string{textproto.CanonicalMIMEHeaderKey(k), m.GetSet()[k]})
		}
		for _, k := range sortedKeys(m.GetAdd()) {
			ops.add = append(ops.add, [2]string{textproto.CanonicalMIMEHeaderKey(k), m.GetAdd()[k]})
		}
		for _, k := range m.GetRemove() {
			ops.remove = append(ops.remove, textproto.CanonicalMIMEHeaderKey(k))
		}
		out = append(out, ops)
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// apply modifies h: set replaces every value, add appends one, remove
// deletes; names are case-insensitive (canonical in h).
func applyHeaderOps(ops []headerOps, h http.Header) {
	for i := range ops {
		for _, kv := range ops[i].set {
			h[kv[0]] = []string{kv[1]}
		}
		for _, kv := range ops[i].add {
			h[kv[0]] = append(h[kv[0]], kv[1])
		}
		for _, k := range ops[i].remove {
			delete(h, k)
		}
	}
}

// pathModifier is a compiled waypointapi.PathModifier.
type pathModifier struct {
	typ   waypointapi.PathModifier_Type
	value string
	re    *regexp.Regexp // REGEX
}

func compilePathModifier(p *waypointapi.PathModifier) (*pathModifier, bool) {
	if p == nil {
		return nil, true
	}
	pm := &pathModifier{typ: p.GetType(), value: p.GetValue()}
	if pm.typ == waypointapi.PathModifier_REGEX {
		re, err := regexp.Compile(p.GetPattern())
		if err != nil {
			return nil, false
		}
		pm.re = re
	}
	return pm, true
}

// modify returns what path becomes; prefixLen is the length of the path
// prefix the rule's match matched (-1: the match was not a prefix match).
func (p *pathModifier) modify(path string, prefixLen int) string {
	if p == nil {
		return path
	}
	switch p.typ {
	case waypointapi.PathModifier_PREFIX:
		if prefixLen < 0 || prefixLen > len(path) {
			return p.value
		}
		return ReplacePrefixMatch(path, prefixLen, p.value)
	case waypointapi.PathModifier_STRING_PREFIX:
		if prefixLen < 0 || prefixLen > len(path) {
			return p.value
		}
		out := p.value + path[prefixLen:]
		if out == "" {
			out = "/"
		}
		return out
	case waypointapi.PathModifier_REGEX:
		return p.re.ReplaceAllString(path, p.value)
	}
	return p.value
}

// ReplacePrefixMatch is Gateway API's ReplacePrefixMatch: path matched a
// PathPrefix whose value (without a trailing "/") is path[:prefixLen], at
// a path element boundary; the matched elements are replaced by
// replacement (a trailing "/" of it ignored), the rest is kept, and an
// empty result is "/". "/foo/bar" with prefix "/foo" and "/xyz/" is
// "/xyz/bar"; "/foo/" with "/xyz" is "/xyz/"; "/foo" with "" is "/".
func ReplacePrefixMatch(path string, prefixLen int, replacement string) string {
	out := strings.TrimSuffix(replacement, "/") + path[prefixLen:]
	if out == "" || out[0] != '/' {
		out = "/" + out
	}
	return out
}

// rewrite is a rule's compiled URL rewrite.
type rewrite struct {
	path *pathModifier
	host string
}

// redirect is a rule's compiled redirect.
type redirect struct {
	scheme, host string
	port         uint32
	path         *pathModifier
	code         int
	rule         waypointapi.Redirect_PortRule
}

func compileRedirect(r *waypointapi.Redirect) (*redirect, bool) {
	if r == nil {
		return nil, true
	}
	pm, ok := compilePathModifier(r.GetPath())
	rd := &redirect{scheme: strings.ToLower(r.GetScheme()), host: r.GetHost(), port: r.GetPort(), path: pm, code: int(r.GetCode()), rule: r.GetPortRule()}
	switch rd.code {
	case 301, 302, 303, 307, 308:
	case 0:
		rd.code = http.StatusFound
	default:
		ok = false
	}
	return rd, ok
}

// Location is where a redirect sends a request for path (with query
// rawQuery, "" none) to host (the request's Host, maybe with a port) on
// the service port svcPort; prefixLen as for a rewrite. The port rule is
// Gateway API's (GATEWAY: the well-known port of a new scheme, else the
// addressed port) or Istio's; a port that is the default of the scheme
// (http 80, https 443) is left out, as Gateway API asks.
func (rd *redirect) location(host, path, rawQuery string, prefixLen int, svcPort uint16) string {
	scheme := rd.scheme
	if scheme == "" {
		scheme = "http"
	}
	reqHost, reqPort := splitHostPort(host)
	h := rd.host
	if h == "" {
		h = reqHost
	}
	var port uint32
	switch {
	case rd.port != 0:
		port = rd.port
	case rd.rule == waypointapi.Redirect_GATEWAY && rd.scheme != "":
		port = defaultPort(scheme)
		if port == 0 {
			port = uint32(svcPort)
		}
	case rd.rule == waypointapi.Redirect_GATEWAY, rd.rule == waypointapi.Redirect_REQUEST_PORT:
		port = uint32(svcPort)
	case rd.rule == waypointapi.Redirect_PROTOCOL_DEFAULT:
		port = defaultPort(scheme)
	case rd.rule == waypointapi.Redirect_KEEP && rd.host == "":
		// Envoy keeps the Host's port, unless it is the default port of
		// the scheme the request had and the scheme changes.
		if p, err := strconv.ParseUint(reqPort, 10, 16); err == nil && !(rd.scheme != "" && rd.scheme != "http" && p == 80) {
			port = uint32(p)
		}
	}
	p := rd.path.modify(path, prefixLen)
	if i := strings.IndexByte(p, '?'); i >= 0 && rd.path != nil && rd.path.typ == waypointapi.PathModifier_FULL {
		// Envoy: a query in the new path replaces the request's.
		p, rawQuery = p[:i], p[i+1:]
	}
	var b strings.Builder
	b.Grow(len(scheme) + len(h) + len(p) + len(rawQuery) + 16)
	b.WriteString(scheme)
	b.WriteString("://")
	if strings.IndexByte(h, ':') >= 0 {
		b.WriteString("[" + h + "]") // an IPv6 literal
	} else {
		b.WriteString(h)
	}
	if port != 0 && port != defaultPort(scheme) {
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(uint64(port), 10))
	}
	b.WriteString(p)
	if rawQuery != "" {
		b.WriteByte('?')
		b.WriteString(rawQuery)
	}
	return b.String()
}

func defaultPort(scheme string) uint32 {
	switch scheme {
	case "http":
		return 80
	case "https":
		return 443
	}
	return 0
}

// splitHostPort splits a Host header into host and port ("" when none).
func splitHostPort(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), ""
}

// directResponse is a rule's compiled direct response.
type directResponse struct {
	code int
	body []byte
}

// Edit is what routing decided to do to one request besides sending it:
// the rule's filters and those of the backend it picked. The zero Edit
// does nothing.
type Edit struct {
	rule      *Rule
	backend   *backend // the backend picked (nil: none); a retry keeps it
	prefixLen int      // of the matched path prefix; -1: not a prefix match
	cors      corsState
	origin    string // the allowed Origin (cors)
}

// backendOr is the backend a retry after prev keeps, or rule's choice by
// weight when there is none to keep (prev nil: a first attempt).
func (prev *Edit) backendOr(rule *Rule, rnd func(uint64) uint64) (*backend, bool) {
	if prev != nil && prev.backend != nil {
		return prev.backend, true
	}
	return rule.choose(rnd(max(rule.total, 1)))
}

// Request applies the request filters to r, whose header h is (the
// upstream request's, in place): the rule's request header modifiers, the
// backend's, then the URL rewrite (path, Host). Nothing for the zero Edit.
func (e Edit) Request(r *http.Request, h http.Header) {
	if e.rule == nil {
		return
	}
	applyHeaderOps(e.rule.reqMods, h)
	if e.backend != nil {
		applyHeaderOps(e.backend.reqMods, h)
	}
	if rw := e.rule.rewrite; rw != nil {
		if rw.path != nil {
			p := rw.path.modify(r.URL.Path, e.prefixLen)
			if i := strings.IndexByte(p, '?'); i >= 0 && rw.path.typ == waypointapi.PathModifier_FULL {
				p, r.URL.RawQuery = p[:i], p[i+1:]
			}
			r.URL.Path, r.URL.RawPath = p, ""
			if strings.HasPrefix(r.RequestURI, "/") {
				r.RequestURI = r.URL.RequestURI()
			}
		}
		if rw.host != "" {
			r.Host = rw.host
		}
	}
}

// Response applies the response header modifiers to h: the backend's,
// then the rule's.
func (e Edit) Response(h http.Header) {
	if e.rule == nil {
		return
	}
	if e.backend != nil {
		applyHeaderOps(e.backend.respMods, h)
	}
	applyHeaderOps(e.rule.respMods, h)
	if e.cors == corsAllowed {
		e.rule.cors.response(h, e.origin)
	}
}

// ModifiesResponse reports whether Response changes anything.
func (e Edit) ModifiesResponse() bool {
	return e.rule != nil && (len(e.rule.respMods) > 0 || e.backend != nil && len(e.backend.respMods) > 0 || e.cors == corsAllowed)
}

// Answers reports whether the rule answers the request itself (a CORS
// preflight, a redirect or a direct response) instead of routing it.
func (e Edit) Answers() bool {
	return e.rule != nil && (e.rule.redirect != nil || e.rule.direct != nil || e.cors == corsPreflight || e.cors == corsRefused)
}

// Answer writes the rule's own answer to r (Answers) to rw, after the
// rule's response header modifiers, and returns the status. svcPort is the
// service port the client addressed (a redirect's port when none is
// derived otherwise).
func (e Edit) Answer(rw http.ResponseWriter, r *http.Request, svcPort uint16) int {
	h := rw.Header()
	switch {
	case e.cors == corsPreflight || e.cors == corsRefused:
		// Envoy's CORS filter answers before the route acts.
		if e.cors == corsPreflight {
			e.rule.cors.preflight(h, r, e.origin)
		}
		applyHeaderOps(e.rule.respMods, h)
		rw.WriteHeader(http.StatusOK)
		return http.StatusOK
	case e.rule.redirect != nil:
		if e.cors == corsAllowed {
			e.rule.cors.response(h, e.origin)
		}
		rd := e.rule.redirect
		h.Set("Location", rd.location(r.Host, r.URL.Path, r.URL.RawQuery, e.prefixLen, svcPort))
		applyHeaderOps(e.rule.respMods, h)
		rw.WriteHeader(rd.code)
		return rd.code
	default:
		if e.cors == corsAllowed {
			e.rule.cors.response(h, e.origin)
		}
		d := e.rule.direct
		if len(d.body) > 0 {
			h.Set("Content-Type", "text/plain")
			h.Set("Content-Length", strconv.Itoa(len(d.body)))
		}
		applyHeaderOps(e.rule.respMods, h)
		rw.WriteHeader(d.code)
		if len(d.body) > 0 && r.Method != http.MethodHead {
			_, _ = rw.Write(d.body)
		}
		return d.code
	}
}
