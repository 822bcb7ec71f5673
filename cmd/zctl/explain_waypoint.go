package main

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// verdictDepends: the waypoint's L7 policies read request fields and no
// request was given (--method, --path).
const verdictDepends = "DEPENDS"

// errDepends is returned when the verdict depends on the request (exit 4).
var errDepends = errors.New("the verdict depends on the request: give --method and --path")

// verdictRemote: the destination is on another network (double HBONE
// through its gateway); its policies are in that network's state.
const verdictRemote = "REMOTE"

// errRemote is returned for verdictRemote (exit 4, like errDepends: this
// state cannot decide).
var errRemote = errors.New("the destination is on another network: its node proxy decides with state this one does not hold")

// waypointDump is one waypoint's /config_dump (its waypointapi.Config),
// compiled by the waypoint's own Compile.
type waypointDump struct {
	from string
	raw  *waypointapi.Config
	cfg  *waypoint.Config
}

// request is what explain is told beyond the flow: the waypoints' configs
// and the HTTP request at them.
type request struct {
	waypoints    []*waypointDump
	method, path string
	// header holds the request headers (--header, and --jwt as
	// Authorization: Bearer).
	header http.Header
}

func (r *request) given() bool { return r.method != "" || r.path != "" || len(r.header) > 0 }

// parseHeaders turns --header "Name: value" flags (and --jwt) into headers.
func parseHeaders(flags []string, jwt string) (http.Header, error) {
	h := http.Header{}
	for _, f := range flags {
		k, v, ok := strings.Cut(f, ":")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--header %q: want \"Name: value\"", f)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if jwt != "" {
		h.Set("Authorization", "Bearer "+jwt)
	}
	return h, nil
}

// parseWaypointDump decodes and compiles a waypoint's /config_dump.
func parseWaypointDump(from string, b []byte) (*waypointDump, error) {
	c := &waypointapi.Config{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("decoding the waypoint config of %s: %w", from, err)
	}
	cfg, err := waypoint.Compile(c)
	if err != nil {
		return nil, fmt.Errorf("the waypoint config of %s: %w", from, err)
	}
	return &waypointDump{from: from, raw: c, cfg: cfg}, nil
}

// loadWaypoints reads each waypoint admin address's /config_dump and each
// saved file.
func loadWaypoints(admins, files []string) ([]*waypointDump, error) {
	var out []*waypointDump
	for _, a := range admins {
		b, url, err := adminRequest(http.MethodGet, a, "/config_dump", "is the waypoint's admin reachable, and is --waypoint-admin right?")
		if err != nil {
			return nil, err
		}
		wd, err := parseWaypointDump("admin "+url, b)
		if err != nil {
			return nil, err
		}
		out = append(out, wd)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		wd, err := parseWaypointDump("file "+f, b)
		if err != nil {
			return nil, err
		}
		out = append(out, wd)
	}
	return out, nil
}

// waypointFor returns the config of the waypoint workload wp (matched by
// the identity it runs as), nil when none was given.
func (r *request) waypointFor(wp *state.Workload) *waypointDump {
	id := wp.Identity().String()
	for _, wd := range r.waypoints {
		if wd.raw.GetIdentity() == id {
			return wd
		}
	}
	return nil
}

func gatewayRef(c *waypointapi.Config) string {
	return "Gateway/" + c.GetNamespace() + "/" + c.GetName()
}

// waypointAuthz runs the waypoint's own binding check and authorization
// (proxy/waypoint: Config.Bind, Config.Authorize) for src's CONNECT to
// authority, as the waypoint sees it (the client's identity over mTLS),
// adding its steps. host is the Host header (the name dialled).
func waypointAuthz(e *explanation, req *request, wd *waypointDump, src *state.Workload, authority netip.AddrPort, host string) outcome {
	gw := gatewayRef(wd.raw)
	b, err := wd.cfg.Bind(authority)
	if err != nil {
		e.add("waypoint authz", "REFUSED: "+err.Error(), gw, "read from "+wd.from)
		return outcome{verdict: verdictRefused, why: err.Error()}
	}
	var keys, l7 []string
	for _, p := range wd.cfg.PoliciesFor(b.Hostname) {
		k := p.Key
		if p.DryRun {
			k += " (dry-run)"
		} else if p.Action == waypointapi.Action_AUDIT {
			k += " (audit)"
		} else if p.HTTP {
			l7 = append(l7, p.Key)
		}
		keys = append(keys, k)
	}
	what := "the workload"
	if b.Service != "" {
		what = "Service/" + b.Service
	}
	e.add("waypoint policies", or(strings.Join(keys, ", "), "none"), gw,
		fmt.Sprintf("applying at the waypoint to %s port %d (%s); read from %s", what, authority.Port(), b.Protocol, wd.from))
	id := src.Identity()
	a := &stream.Attrs{
		Principal: strings.TrimPrefix(id.String(), "spiffe://"), Namespace: id.Namespace,
		SrcIP: firstAddr(src), DstIP: authority.Addr(), DstPort: authority.Port(), Service: b.Hostname,
		HTTP: b.Protocol != waypointapi.Protocol_TCP,
	}
	seen := fmt.Sprintf("sees %s (the client's, over mTLS) from %s to %s", id, a.SrcIP, authority)
	reqDesc := "TCP: L4 fields only (rules with HTTP fields never allow, always deny)"
	if a.HTTP {
		if !req.given() && len(l7) > 0 {
			refs := make([]string, len(l7))
			for i, k := range l7 {
				refs[i] = policyRef(k)
			}
			e.add("waypoint authz", verdictDepends+" on the request", strings.Join(refs, ", "),
				seen+"; these policies read request fields (host, method, path, headers): give --method and --path")
			return outcome{verdict: verdictDepends, why: "L7 policies " + strings.Join(l7, ", ") + " read the request"}
		}
		a.Method, a.Path, a.Host = or(req.method, "GET"), or(req.path, "/"), or(host, b.Hostname)
		// 1. normalization, as the waypoint's first step: policies see the
		// normalized path (mesh pathNormalization).
		fwd, p, err := wd.cfg.NormalizePath(a.Path)
		if err != nil {
			e.add("waypoint normalization", "REJECTED (400): "+err.Error(), gw, "the path cannot be normalized")
			return outcome{verdict: verdictDeny, why: "path refused with 400: " + err.Error()}
		}
		if fwd != a.Path {
			e.add("waypoint normalization", "path "+fwd, gw, "normalized from "+a.Path+" (mesh pathNormalization)")
		}
		a.Path = p
		hr, err := http.NewRequest(a.Method, "http://"+a.Host+fwd, nil)
		if err != nil {
			return outcome{verdict: verdictRefused, why: "the request: " + err.Error()}
		}
		hr.Host = a.Host
		for k, vs := range req.header {
			hr.Header[k] = append([]string(nil), vs...)
		}
		// 2. authentication, as the waypoint runs it before any policy.
		auth, err := wd.cfg.Authenticate(b.Hostname, hr, time.Now())
		switch {
		case err != nil:
			e.add("waypoint authn", "REJECTED (401): "+err.Error(), gw, "a RequestAuthentication applies and the token is not valid for it")
			return outcome{verdict: verdictDeny, why: "JWT rejected with 401: " + err.Error()}
		case auth != nil:
			e.add("waypoint authn", "request principal "+auth.Principal, gw, "a valid JWT (RequestAuthentication)")
		case hr.Header.Get("Authorization") != "":
			e.add("waypoint authn", "no RequestAuthentication applies", gw, "the token is passed on unread; the request is anonymous")
		}
		a.Auth = auth
		a.Header = func(name string) (string, bool) {
			vs, ok := hr.Header[http.CanonicalHeaderKey(name)]
			if !ok {
				return "", false
			}
			return strings.Join(vs, ","), true
		}
		reqDesc = fmt.Sprintf("%s %s host %s, no request headers", a.Method, a.Path, a.Host)
		if len(hr.Header) > 0 {
			names := slices.Sorted(maps.Keys(hr.Header))
			reqDesc = fmt.Sprintf("%s %s host %s, headers %s", a.Method, a.Path, a.Host, strings.Join(names, ", "))
		}
		if len(l7) == 0 {
			reqDesc = "any request: no applying policy reads request fields"
		}
	}
	v := wd.cfg.Authorize(a)
	out := outcome{verdict: verdictAllow, policy: v.Policy, why: v.Reason}
	result := "ALLOW (no allow policies)"
	switch {
	case !v.Allow:
		out.verdict, result = verdictDeny, "DENY ("+v.Reason+")"
		if v.Policy == "" { // no ALLOW matched: name them
			for _, p := range wd.cfg.PoliciesFor(b.Hostname) {
				if p.Action == waypointapi.Action_ALLOW && !p.DryRun {
					out.unmatched = append(out.unmatched, p.Key)
				}
			}
		}
	case v.Policy != "":
		result, out.why = "ALLOW (explicitly allowed)", "allowed by "+v.Policy
	default:
		out.why = "no policy selects it"
	}
	by := ""
	if v.Policy != "" {
		by = policyRef(v.Policy)
	}
	e.add("waypoint authz", result, by, seen+"; "+reqDesc)
	for _, d := range v.DryRun {
		k, what, _ := strings.Cut(d, "=")
		e.add("dry-run", "waypoint would "+what, policyRef(k), "dry-run and AUDIT policies are never enforced")
	}
	return out
}
