package translate

import (
	"net/netip"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// EnforcedByWaypoint starts the status message of a targetRef policy that a
// waypoint of ours enforces; the waypoints follow ("ns/name, ...").
const EnforcedByWaypoint = "enforced by waypoint "

// WaypointConfigs builds the waypointapi.Config of every waypoint Gateway
// (class istio-waypoint) that has an address, keyed by its xDS resource name
// "<namespace>/<name>", from the objects and their translation res: the
// services and workloads res binds to the waypoint, the AuthorizationPolicies
// attached to it (targetRefs to the Gateway, to GatewayClass istio-waypoint
// from the root namespace, or to a Service or ServiceEntry bound to it) and
// the HTTPRoutes and GRPCRoutes (parentRefs kind Service or ServiceEntry)
// of its services.
//
// It also returns res.Policies with the status of every policy that a
// config carries rewritten to say which waypoints enforce it (node proxies
// still never get it). Policy values a waypoint cannot enforce fail closed as
// for node proxies: an ALLOW rule is dropped, a DENY rule matches every
// request; each is named in the status. Pure, like Translate.
func WaypointConfigs(cfg Config, objs *cluster.Objects, res *Result) (map[string]*waypointapi.Config, []PolicyStatus) {
	cfg = cfg.withDefaults()
	out := map[string]*waypointapi.Config{}
	if objs == nil || res == nil {
		return out, res.policiesOrNil()
	}
	t := newTranslator(cfg, objs, nil)
	// VirtualServices and DestinationRules (virtualservice.go) report what
	// became of them even when no waypoint exists.
	ir := newIstioRouting(t, res)
	if !slices.ContainsFunc(objs.Gateways, func(g *gatewayv1.Gateway) bool {
		return string(g.Spec.GatewayClassName) == WaypointClass
	}) {
		return out, append(slices.Clone(res.Policies), ir.statuses()...)
	}
	t.buildIndex()
	t.translateWaypoints()

	authn := newAuthnState()
	enforcedBy := map[string][]string{} // policy ns/name → waypoints
	problemsOf := map[string][]string{}
	policies := map[string]*securityv1.AuthorizationPolicy{}
	for _, ap := range objs.AuthorizationPolicies {
		policies[ap.Namespace+"/"+ap.Name] = ap
	}
	for _, key := range sortedKeys(t.idx.waypoints) {
		w := t.idx.waypoints[key]
		ns, name, _ := strings.Cut(key, "/")
		c := &waypointapi.Config{
			Name: name, Namespace: ns, TrafficType: w.trafficType,
			// The waypoint Deployment runs as a ServiceAccount named after
			// the Gateway, as istiod's waypoint controller creates it.
			Identity: "spiffe://" + cfg.TrustDomain + "/ns/" + ns + "/sa/" + name,
		}
		if a := w.addr.GetAddress(); a != nil {
			c.Addresses = [][]byte{a.GetAddress()}
		}
		bound := t.boundTo(w, res, c, ir)
		var required []*waypointapi.Policy
		c.Authentications, required = t.authnFor(key, bound, authn)
		c.Policies = append(c.Policies, required...)
		attach := func(pkey string, services []string, target string) {
			ap := policies[pkey]
			if ap == nil {
				return
			}
			p, bad := convertWaypointPolicy(ap)
			p.Services, p.Target = services, target
			c.Policies = append(c.Policies, p)
			if !slices.Contains(enforcedBy[pkey], key) {
				enforcedBy[pkey] = append(enforcedBy[pkey], key)
			}
			problemsOf[pkey] = bad
		}
		for _, pkey := range res.WaypointPolicies[key] {
			attach(pkey, nil, "Gateway "+key)
		}
		for _, ap := range objs.AuthorizationPolicies {
			var hosts, targets []string
			for _, r := range targetRefs(ap) {
				if r.namespace != "" && r.namespace != ap.Namespace {
					continue
				}
				if h, ok := bound[r.kind+" "+ap.Namespace+"/"+r.name]; ok && (r.group == "" && r.kind == "Service" || r.group == "networking.istio.io" && r.kind == "ServiceEntry") {
					hosts = append(hosts, h...)
					targets = append(targets, r.kind+" "+ap.Namespace+"/"+r.name)
				}
			}
			if len(hosts) > 0 {
				attach(ap.Namespace+"/"+ap.Name, dedupe(hosts), strings.Join(targets, ", "))
			}
		}
		sort.SliceStable(c.Policies, func(i, j int) bool {
			return c.Policies[i].Namespace+"/"+c.Policies[i].Name < c.Policies[j].Namespace+"/"+c.Policies[j].Name
		})
		out[key] = c
	}
	statuses := append(slices.Clone(res.Policies), ir.statuses()...)
	for i := range statuses {
		st := &statuses[i]
		if st.Kind == kindRA {
			setAuthnStatus(st, authn)
			continue
		}
		wps := enforcedBy[st.Name]
		if st.Kind != "AuthorizationPolicy" || len(wps) == 0 {
			continue
		}
		sort.Strings(wps)
		st.Message = EnforcedByWaypoint + strings.Join(wps, ", ") + " (targetRefs make it a waypoint policy; node proxies never get it)"
		if bad := problemsOf[st.Name]; len(bad) > 0 {
			st.Invalid = bad
			st.Message += "; values that cannot be enforced fail closed: " + strings.Join(bad, "; ")
		}
	}
	return out, statuses
}

// boundTo fills c's services and workloads from res (those whose waypoint is
// w's address) with the routes attached to each service, and returns the
// hostnames of each bound "Service ns/name" and "ServiceEntry ns/name".
func (t *translator) boundTo(w *waypoint, res *Result, c *waypointapi.Config, ir *istioRouting) map[string][]string {
	bound := map[string][]string{}
	for _, a := range res.Addresses.All() {
		switch {
		case a.GetService() != nil && waypointOf(a.GetService(), w.addr) && w.forService:
			s := a.GetService()
			kind := "ServiceEntry"
			if k8s := t.idx.svcByName[s.GetNamespace()+"/"+s.GetName()]; k8s != nil && t.serviceHostname(k8s) == s.GetHostname() {
				kind = "Service"
			}
			ws := &waypointapi.Service{Name: s.GetName(), Namespace: s.GetNamespace(), Hostname: s.GetHostname(), Kind: kind}
			for _, na := range s.GetAddresses() {
				ws.Addresses = append(ws.Addresses, na.GetAddress())
			}
			for _, p := range s.GetPorts() {
				ws.Ports = append(ws.Ports, t.waypointPort(kind, s, p))
			}
			ws.Routes = ir.routes(w.key, s, t.routesFor(kind, s))
			c.Services = append(c.Services, ws)
			bk := kind + " " + s.GetNamespace() + "/" + s.GetName()
			bound[bk] = append(bound[bk], s.GetHostname())
		case a.GetWorkload() != nil && proto.Equal(a.GetWorkload().GetWaypoint(), w.addr) && w.forWorkload:
			wl := a.GetWorkload()
			c.Workloads = append(c.Workloads, &waypointapi.Workload{
				Uid: wl.GetUid(), Name: wl.GetName(), Namespace: wl.GetNamespace(), Addresses: wl.GetAddresses(),
			})
		}
	}
	sort.Slice(c.Services, func(i, j int) bool {
		return c.Services[i].Namespace+"/"+c.Services[i].Hostname < c.Services[j].Namespace+"/"+c.Services[j].Hostname
	})
	sort.Slice(c.Workloads, func(i, j int) bool { return c.Workloads[i].Uid < c.Workloads[j].Uid })
	return bound
}

// waypointPort decides the protocol of a service port as Istio does:
// appProtocol, else the port name's prefix; HTTP/1.1 for http, HTTP/2 for
// http2, h2c and grpc, else TCP.
func (t *translator) waypointPort(kind string, s *workloadapi.Service, p *workloadapi.Port) *waypointapi.Port {
	wp := &waypointapi.Port{Port: p.GetServicePort()}
	if kind == "Service" {
		if k8s := t.idx.svcByName[s.GetNamespace()+"/"+s.GetName()]; k8s != nil {
			for _, sp := range k8s.Spec.Ports {
				if uint32(sp.Port) == p.GetServicePort() {
					wp.Name = sp.Name
				}
			}
		}
	}
	switch p.GetAppProtocol() {
	case workloadapi.AppProtocol_HTTP11:
		wp.Protocol = waypointapi.Protocol_HTTP
	case workloadapi.AppProtocol_HTTP2, workloadapi.AppProtocol_GRPC:
		wp.Protocol = waypointapi.Protocol_HTTP2
	default:
		if ap := appProtocol(wp.Name, nil); ap == workloadapi.AppProtocol_HTTP11 {
			wp.Protocol = waypointapi.Protocol_HTTP
		} else if ap == workloadapi.AppProtocol_HTTP2 || ap == workloadapi.AppProtocol_GRPC {
			wp.Protocol = waypointapi.Protocol_HTTP2
		}
	}
	return wp
}

// convertWaypointPolicy converts an AuthorizationPolicy for a waypoint, L7
// fields included. It returns the values that cannot be enforced ("field:
// why"), which fail closed.
func convertWaypointPolicy(ap *securityv1.AuthorizationPolicy) (*waypointapi.Policy, []string) {
	p := &waypointapi.Policy{Name: ap.Name, Namespace: ap.Namespace}
	var bad problems
	switch ap.Spec.Action {
	case securityv1beta1.AuthorizationPolicy_ALLOW:
		p.Action = waypointapi.Action_ALLOW
	case securityv1beta1.AuthorizationPolicy_DENY:
		p.Action = waypointapi.Action_DENY
	case securityv1beta1.AuthorizationPolicy_AUDIT:
		p.Action, p.DryRun = waypointapi.Action_AUDIT, true
	default:
		// CUSTOM (ext_authz) has no provider here: deny everything.
		bad.addf("spec.action", "%s is not supported by ztunnel-go's waypoint; the policy denies every request", ap.Spec.Action)
		p.Action, p.Rules = waypointapi.Action_DENY, []*waypointapi.Rule{{}}
		return p, bad
	}
	if v, ok := ap.Annotations["istio.io/dry-run"]; ok && v == "true" {
		p.DryRun = true
	}
	for i, r := range ap.Spec.Rules {
		path := fieldAt("spec.rules", i)
		before := len(bad)
		wr := convertWaypointRule(path, r, &bad)
		switch {
		case len(bad) == before:
			p.Rules = append(p.Rules, wr)
		case p.Action == waypointapi.Action_DENY:
			p.Rules = append(p.Rules, &waypointapi.Rule{}) // matches every request
		}
		// ALLOW/AUDIT: a rule with a bad value is dropped (allows less).
	}
	return p, bad
}

func convertWaypointRule(path string, r *securityv1beta1.Rule, bad *problems) *waypointapi.Rule {
	wr := &waypointapi.Rule{}
	if r == nil {
		return wr
	}
	for i, f := range r.From {
		s := f.GetSource()
		if s == nil {
			continue
		}
		fp := fieldAt(path+".from", i) + ".source"
		wr.From = append(wr.From, &waypointapi.Source{
			Principals:        wpStrings(s.Principals, true),
			NotPrincipals:     wpStrings(s.NotPrincipals, true),
			Namespaces:        wpStrings(s.Namespaces, false),
			NotNamespaces:     wpStrings(s.NotNamespaces, false),
			IpBlocks:          wpCidrs(fp+".ipBlocks", s.IpBlocks, bad),
			NotIpBlocks:       wpCidrs(fp+".notIpBlocks", s.NotIpBlocks, bad),
			RemoteIpBlocks:    wpCidrs(fp+".remoteIpBlocks", s.RemoteIpBlocks, bad),
			NotRemoteIpBlocks: wpCidrs(fp+".notRemoteIpBlocks", s.NotRemoteIpBlocks, bad),
			// "iss/sub" of a JWT the waypoint validated (RequestAuthentication).
			RequestPrincipals:    wpStrings(s.RequestPrincipals, false),
			NotRequestPrincipals: wpStrings(s.NotRequestPrincipals, false),
		})
	}
	for i, t := range r.To {
		o := t.GetOperation()
		if o == nil {
			continue
		}
		op := fieldAt(path+".to", i) + ".operation"
		wr.To = append(wr.To, &waypointapi.Operation{
			Hosts: wpStrings(o.Hosts, false), NotHosts: wpStrings(o.NotHosts, false),
			Ports: ports(op+".ports", o.Ports, bad), NotPorts: ports(op+".notPorts", o.NotPorts, bad),
			Methods: wpStrings(o.Methods, false), NotMethods: wpStrings(o.NotMethods, false),
			Paths: wpStrings(o.Paths, false), NotPaths: wpStrings(o.NotPaths, false),
		})
	}
	for i, c := range r.When {
		cp := fieldAt(path+".when", i)
		switch {
		case strings.HasPrefix(c.Key, "request.headers[") && strings.HasSuffix(c.Key, "]") && len(c.Key) > len("request.headers[]"),
			slices.Contains([]string{"source.ip", "remote.ip", "source.namespace", "source.principal", "destination.ip", "destination.port"}, c.Key),
			slices.Contains([]string{"request.auth.principal", "request.auth.audiences", "request.auth.presenter"}, c.Key),
			validClaimKey(c.Key):
			wr.When = append(wr.When, &waypointapi.Condition{Key: c.Key, Values: wpStrings(c.Values, false), NotValues: wpStrings(c.NotValues, false)})
		default:
			bad.addf(cp+".key", "%q is not an attribute ztunnel-go's waypoint evaluates", c.Key)
		}
	}
	return wr
}

// wpStrings converts Istio's string forms: "*" presence, "x*" prefix, "*x"
// suffix, else exact. principal: a leading "spiffe://" is dropped.
func wpStrings(vs []string, principal bool) []*waypointapi.StringMatch {
	var out []*waypointapi.StringMatch
	for _, v := range vs {
		if principal {
			v = strings.TrimPrefix(v, "spiffe://")
		}
		var m waypointapi.StringMatch
		switch {
		case v == "*":
			m.MatchType = &waypointapi.StringMatch_Presence{Presence: true}
		case strings.HasSuffix(v, "*"):
			m.MatchType = &waypointapi.StringMatch_Prefix{Prefix: strings.TrimSuffix(v, "*")}
		case strings.HasPrefix(v, "*"):
			m.MatchType = &waypointapi.StringMatch_Suffix{Suffix: strings.TrimPrefix(v, "*")}
		default:
			m.MatchType = &waypointapi.StringMatch_Exact{Exact: v}
		}
		out = append(out, &m)
	}
	return out
}

func wpCidrs(path string, vs []string, bad *problems) []*waypointapi.Cidr {
	var out []*waypointapi.Cidr
	for i, v := range vs {
		pfx, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				bad.addf(fieldAt(path, i), "%q is not an IP or CIDR", v)
				continue
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, &waypointapi.Cidr{Address: pfx.Addr().AsSlice(), Length: uint32(pfx.Bits())})
	}
	return out
}

func (r *Result) policiesOrNil() []PolicyStatus {
	if r == nil {
		return nil
	}
	return r.Policies
}

// validClaimKey reports whether k is request.auth.claims[a] or a nested
// request.auth.claims[a][b]..., as Istio spells JWT claims.
func validClaimKey(k string) bool {
	const prefix = "request.auth.claims["
	if !strings.HasPrefix(k, prefix) || !strings.HasSuffix(k, "]") {
		return false
	}
	for _, p := range strings.Split(k[len(prefix):len(k)-1], "][") {
		if p == "" || strings.ContainsAny(p, "[]") {
			return false
		}
	}
	return true
}
