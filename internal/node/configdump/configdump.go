// Package configdump is the node proxy's /config_dump in the shape of Istio's
// ztunnel (the Rust ztunnel's serde output, which istioctl's
// istioctl/pkg/writer/ztunnel/configdump types parse), key for key, with
// ztunnel-go's extra fields as additional keys those readers ignore.
//
// It is a leaf package: the admin server encodes with it and zctl decodes
// with it, so neither reader needs to link the proxy. Enum values are
// written with the Rust ztunnel's names; each name table is indexed by the
// state (and wire) enum value, so a reader maps a name back with Parse.
package configdump

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Name tables, indexed by the state enum value (the wire enum value too).
var (
	// Protocols is state.TunnelProtocol: the Rust ztunnel calls "no tunnel" TCP.
	Protocols = []string{"TCP", "HBONE"}
	// WorkloadTypes is state.WorkloadType, lower case as the Rust ztunnel
	// prints istiod's enum.
	WorkloadTypes = []string{"deployment", "cronjob", "pod", "job"}
	// AppTunnelProtocols is state.AppTunnelProtocol.
	AppTunnelProtocols = []string{"NONE", "PROXY"}
	// IPFamilies is state.IPFamilies; AUTOMATIC is left out of a dump.
	IPFamilies = []string{"", "IPv4", "IPv6", "Dual"}
	// Visibilities is state.Visibility.
	Visibilities = []string{"Public", "Namespace"}
	// LBModes is state.LBMode (the Rust ztunnel's Standard is the
	// unspecified mode).
	LBModes = []string{"Standard", "Strict", "Failover", "Passthrough"}
	// LBHealthPolicies is state.LBHealthPolicy.
	LBHealthPolicies = []string{"OnlyHealthy", "AllowAll"}
	// LBScopes is state.LBScope (the unspecified scope is never accepted).
	LBScopes = []string{"", "Region", "Zone", "Subzone", "Node", "Cluster", "Network"}
	// Scopes is rbac.Scope.
	Scopes = []string{"Global", "Namespace", "WorkloadSelector"}
	// Actions is rbac.Action.
	Actions = []string{"Allow", "Deny"}
)

// Health statuses of workloads and endpoints.
const (
	Healthy   = "Healthy"
	Unhealthy = "Unhealthy"
)

// Network modes of workloads.
const (
	NetworkStandard = "Standard"
	NetworkHost     = "HostNetwork"
)

// Parse returns the index of name in table: the state enum value it names.
// An unknown name is an error (a guessed value could widen what a reader
// rebuilding the state allows).
func Parse[E ~uint8](table []string, name string) (E, error) {
	if name == "" {
		return 0, fmt.Errorf("empty value (want one of %s)", strings.Join(nonEmpty(table), ", "))
	}
	i := slices.Index(table, name)
	if i < 0 {
		return 0, fmt.Errorf("unknown value %q (want one of %s)", name, strings.Join(nonEmpty(table), ", "))
	}
	return E(i), nil
}

func nonEmpty(t []string) []string {
	return slices.DeleteFunc(slices.Clone(t), func(s string) bool { return s == "" })
}

func name[E ~uint8](table []string, v E) string {
	if int(v) < len(table) {
		return table[v]
	}
	return "UNKNOWN"
}

// Dump is the whole /config_dump. Workloads and services are lists sorted
// by uid and namespace/hostname (istioctl reads a list or the Rust
// ztunnel's map alike).
type Dump struct {
	Workloads     []Workload               `json:"workloads"`
	Services      []Service                `json:"services"`
	Policies      []Policy                 `json:"policies"`
	Certificates  []Certificate            `json:"certificates"`
	WorkloadState map[string]WorkloadState `json:"workloadState"`

	// Extras.
	Generation uint64 `json:"generation"`
	// PodProxies is the in-pod manager's own state beside workloadState.
	PodProxies *PodProxies `json:"podProxies,omitempty"`
}

// Workload is the Rust ztunnel's Workload.
type Workload struct {
	WorkloadIPs       []netip.Addr       `json:"workloadIps"`
	Waypoint          *GatewayAddress    `json:"waypoint,omitempty"`
	NetworkGateway    *GatewayAddress    `json:"networkGateway,omitempty"`
	Protocol          string             `json:"protocol"`
	NetworkMode       string             `json:"networkMode"`
	UID               string             `json:"uid"`
	Name              string             `json:"name"`
	Namespace         string             `json:"namespace"`
	TrustDomain       string             `json:"trustDomain,omitempty"`
	ServiceAccount    string             `json:"serviceAccount,omitempty"`
	Network           string             `json:"network,omitempty"`
	WorkloadName      string             `json:"workloadName,omitempty"`
	WorkloadType      string             `json:"workloadType,omitempty"`
	CanonicalName     string             `json:"canonicalName,omitempty"`
	CanonicalRevision string             `json:"canonicalRevision,omitempty"`
	Hostname          string             `json:"hostname,omitempty"`
	Node              string             `json:"node,omitempty"`
	NativeTunnel      bool               `json:"nativeTunnel,omitempty"`
	ApplicationTunnel *ApplicationTunnel `json:"applicationTunnel,omitempty"`
	// AuthorizationPolicies are the policy keys ("ns/name") istiod selected.
	AuthorizationPolicies []string       `json:"authorizationPolicies,omitempty"`
	Status                string         `json:"status"`
	ClusterID             string         `json:"clusterId"`
	Locality              state.Locality `json:"locality,omitzero"`
	// Services are the keys ("ns/hostname") of the services the workload
	// serves; its ports for each are in that service's endpoints.
	Services []string `json:"services,omitempty"`
	Capacity uint32   `json:"capacity"`
}

// ApplicationTunnel is how a sandwiched workload accepts tunnelled traffic.
type ApplicationTunnel struct {
	Protocol string `json:"protocol"`
	// Port is absent when the target port is used.
	Port *uint16 `json:"port,omitempty"`
}

// GatewayAddress is a waypoint or network gateway: destination is
// "namespace/hostname" or "network/ip".
type GatewayAddress struct {
	Destination   string `json:"destination"`
	HBONEMTLSPort uint16 `json:"hboneMtlsPort"`
}

// WeightedWaypoint is one canary waypoint.
type WeightedWaypoint struct {
	Destination GatewayAddress `json:"destination"`
	Weight      uint32         `json:"weight"`
}

// Service is the Rust ztunnel's Service.
type Service struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Hostname  string `json:"hostname"`
	// VIPs are "network/ip" (the network empty for the default one).
	VIPs []string `json:"vips"`
	// CIDRVIPs are "network/cidr", for addresses that are prefixes.
	CIDRVIPs []string `json:"cidrVips,omitempty"`
	// Ports maps a service port to its target port (0: each endpoint's own).
	Ports map[string]uint16 `json:"ports"`
	// Endpoints by workload uid.
	Endpoints         map[string]Endpoint `json:"endpoints"`
	SubjectAltNames   []string            `json:"subjectAltNames"`
	Waypoint          *GatewayAddress     `json:"waypoint,omitempty"`
	WeightedWaypoints []WeightedWaypoint  `json:"weightedWaypoints,omitempty"`
	LoadBalancer      *LoadBalancer       `json:"loadBalancer,omitempty"`
	IPFamilies        string              `json:"ipFamilies,omitempty"`
	Canonical         bool                `json:"canonical"`
	Visibility        string              `json:"visibility"`

	// Extras.
	// AppProtocols names the application protocol of the ports that declare
	// one (service port -> HTTP11, HTTP2, GRPC, TCP or TLS).
	AppProtocols       map[string]string `json:"appProtocols,omitempty"`
	IngressUseWaypoint bool              `json:"ingressUseWaypoint,omitempty"`
	Extensions         []state.Extension `json:"extensions,omitempty"`
	AliasOf            string            `json:"aliasOf,omitempty"`
}

// Key is the service's "namespace/hostname".
func (s *Service) Key() string { return s.Namespace + "/" + s.Hostname }

// Endpoint is a workload serving a service.
type Endpoint struct {
	WorkloadUID string `json:"workloadUid"`
	// Service is the service key, as older Rust ztunnels (and istioctl's
	// type) have it.
	Service string `json:"service"`
	// Address is the workload's first IP, "network/ip"; absent without one.
	Address string `json:"address,omitempty"`
	// Port maps the service port to this workload's target port.
	Port   map[string]uint16 `json:"port"`
	Status string            `json:"status"`
}

// LoadBalancer is a service's endpoint selection.
type LoadBalancer struct {
	RoutingPreferences []string `json:"routingPreferences"`
	Mode               string   `json:"mode"`
	HealthPolicy       string   `json:"healthPolicy"`
}

// Policy is the Rust ztunnel's Authorization: rules are
// rule -> clause -> match (any rule, all clauses, any match).
type Policy struct {
	Name      string      `json:"name"`
	Namespace string      `json:"namespace"`
	Scope     string      `json:"scope"`
	Action    string      `json:"action"`
	Rules     [][][]Match `json:"rules"`
	DryRun    bool        `json:"dryRun"`

	// Extras.
	Key   string `json:"key"`
	Audit bool   `json:"audit,omitempty"`
}

// Match is one RBAC match; empty lists are left out.
type Match struct {
	Namespaces          []StringMatch         `json:"namespaces,omitempty"`
	NotNamespaces       []StringMatch         `json:"notNamespaces,omitempty"`
	ServiceAccounts     []rbac.ServiceAccount `json:"serviceAccounts,omitempty"`
	NotServiceAccounts  []rbac.ServiceAccount `json:"notServiceAccounts,omitempty"`
	Principals          []StringMatch         `json:"principals,omitempty"`
	NotPrincipals       []StringMatch         `json:"notPrincipals,omitempty"`
	SourceIPs           []netip.Prefix        `json:"sourceIps,omitempty"`
	NotSourceIPs        []netip.Prefix        `json:"notSourceIps,omitempty"`
	DestinationIPs      []netip.Prefix        `json:"destinationIps,omitempty"`
	NotDestinationIPs   []netip.Prefix        `json:"notDestinationIps,omitempty"`
	DestinationPorts    []uint16              `json:"destinationPorts,omitempty"`
	NotDestinationPorts []uint16              `json:"notDestinationPorts,omitempty"`
}

// StringMatch is serde's external tagging of the Rust enum: exactly one of
// {"Exact": v}, {"Prefix": v}, {"Suffix": v} or {"Presence": []}.
type StringMatch struct {
	Exact  *string `json:"Exact,omitempty"`
	Prefix *string `json:"Prefix,omitempty"`
	Suffix *string `json:"Suffix,omitempty"`
	// Presence is an empty list when set (serde's empty tuple variant).
	Presence *[]string `json:"Presence,omitempty"`
}

// Certificate is one identity's certificate state.
type Certificate struct {
	Identity  string     `json:"identity"`
	State     string     `json:"state"`
	CertChain []CertInfo `json:"certChain"`
	RootCerts []CertInfo `json:"rootCerts"`

	// Extras.
	LastError   string `json:"lastError,omitempty"`
	NextRefresh string `json:"nextRefresh,omitempty"`
}

// CertInfo is one certificate; the serial number is decimal.
type CertInfo struct {
	PEM            string `json:"pem"`
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`
	ExpirationTime string `json:"expirationTime"`
}

// WorkloadState is one pod proxy, keyed by pod UID in Dump.WorkloadState.
type WorkloadState struct {
	State       string       `json:"state"`
	Connections *Connections `json:"connections,omitempty"`
	Info        WorkloadInfo `json:"info"`

	// Extras (inpodstate.PodState).
	Netns     string `json:"netns,omitempty"`
	Since     string `json:"since,omitempty"`
	LastError string `json:"lastError,omitempty"`
}

// WorkloadInfo names the pod a proxy serves.
type WorkloadInfo struct {
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
	TrustDomain    string `json:"trustDomain,omitempty"`
	// UID is the pod UID (an extra: the map key holds it too).
	UID string `json:"uid,omitempty"`
}

// Connections are a pod proxy's open connections.
type Connections struct {
	Inbound  []InboundConnection  `json:"inbound"`
	Outbound []OutboundConnection `json:"outbound"`
}

// InboundConnection: OriginalDst is the destination service's hostname,
// null when there is none; ActualDst the pod address served.
type InboundConnection struct {
	Src         string  `json:"src"`
	OriginalDst *string `json:"originalDst"`
	ActualDst   string  `json:"actualDst"`
	Protocol    string  `json:"protocol"`
}

// OutboundConnection: OriginalDst is where the application connected,
// ActualDst the next hop (a pod's or waypoint's HBONE port, or the
// destination itself for plain TCP).
type OutboundConnection struct {
	Src         string `json:"src"`
	OriginalDst string `json:"originalDst"`
	ActualDst   string `json:"actualDst"`
	Protocol    string `json:"protocol"`
}

// PodProxies is the in-pod manager's state that workloadState has no key
// for.
type PodProxies struct {
	// SnapshotReceived: the CNI agent has sent its first full snapshot.
	SnapshotReceived bool `json:"snapshotReceived"`
	// Draining are proxies of removed or replaced pods still finishing their
	// connections (a uid may appear more than once, and beside the same uid
	// in workloadState).
	Draining []WorkloadState `json:"draining,omitempty"`
}

// NetworkIP formats "network/ip" (the network empty for the default one).
func NetworkIP(network string, ip netip.Addr) string { return network + "/" + ip.String() }

// ParseNetworkIP splits "network/ip"; the IP is the text after the last
// slash (networks have none, IPv6 addresses no slash).
func ParseNetworkIP(s string) (string, netip.Addr, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return "", netip.Addr{}, fmt.Errorf("%q is not network/ip", s)
	}
	ip, err := netip.ParseAddr(s[i+1:])
	if err != nil {
		return "", netip.Addr{}, fmt.Errorf("%q is not network/ip: %w", s, err)
	}
	return s[:i], ip, nil
}

// ParseNetworkPrefix splits "network/cidr".
func ParseNetworkPrefix(s string) (string, netip.Prefix, error) {
	i := strings.IndexByte(s, '/')
	if i < 0 {
		return "", netip.Prefix{}, fmt.Errorf("%q is not network/cidr", s)
	}
	p, err := netip.ParsePrefix(s[i+1:])
	if err != nil {
		return "", netip.Prefix{}, fmt.Errorf("%q is not network/cidr: %w", s, err)
	}
	return s[:i], p, nil
}

// FromGateway converts a state gateway address (nil: nil).
func FromGateway(g *state.GatewayAddress) *GatewayAddress {
	if g == nil {
		return nil
	}
	out := &GatewayAddress{HBONEMTLSPort: g.HBONEPort}
	if g.IsHostname() {
		out.Destination = g.Hostname.Key()
	} else {
		out.Destination = NetworkIP(g.Address.Network, g.Address.IP)
	}
	return out
}

// Gateway converts back. A destination whose text after the last slash is
// an IP is an address; anything else is namespace/hostname.
func (g *GatewayAddress) Gateway() (*state.GatewayAddress, error) {
	if g == nil {
		return nil, nil
	}
	out := &state.GatewayAddress{HBONEPort: g.HBONEMTLSPort}
	if network, ip, err := ParseNetworkIP(g.Destination); err == nil {
		out.Address = state.NetworkIP{Network: network, IP: ip}
		return out, nil
	}
	ns, host, ok := strings.Cut(g.Destination, "/")
	if !ok || ns == "" || host == "" {
		return nil, fmt.Errorf("gateway destination %q is neither namespace/hostname nor network/ip", g.Destination)
	}
	out.Hostname = state.NamespacedHostname{Namespace: ns, Hostname: host}
	return out, nil
}

// FromSnapshot converts one snapshot's workloads, services (with their
// endpoints) and policies.
func FromSnapshot(snap *state.Snapshot) (wls []Workload, svcs []Service, pols []Policy) {
	d := snap.Dump()
	svcs = make([]Service, 0, len(d.Services))
	byKey := make(map[string]int, len(d.Services))
	for _, s := range d.Services {
		byKey[s.Key] = len(svcs)
		svcs = append(svcs, FromService(s))
	}
	wls = make([]Workload, 0, len(d.Workloads))
	for _, w := range d.Workloads {
		wls = append(wls, FromWorkload(w))
		for _, sp := range w.Services {
			i, ok := byKey[sp.Service]
			if !ok {
				continue
			}
			svcs[i].Endpoints[w.UID] = endpoint(w, sp)
		}
	}
	pols = make([]Policy, 0, len(d.Policies))
	for _, p := range d.Policies {
		pols = append(pols, FromPolicy(p))
	}
	return wls, svcs, pols
}

func status(healthy bool) string {
	if healthy {
		return Healthy
	}
	return Unhealthy
}

func portKey(p uint16) string { return strconv.Itoa(int(p)) }

func endpoint(w *state.Workload, sp state.ServicePorts) Endpoint {
	ep := Endpoint{WorkloadUID: w.UID, Service: sp.Service, Port: make(map[string]uint16, len(sp.Ports)), Status: status(w.Healthy)}
	if len(w.Addresses) > 0 {
		ep.Address = NetworkIP(w.Network, w.Addresses[0])
	}
	for _, pm := range sp.Ports {
		ep.Port[portKey(pm.ServicePort)] = pm.TargetPort
	}
	return ep
}

// FromWorkload converts a workload (its endpoint ports go to the services).
func FromWorkload(w *state.Workload) Workload {
	out := Workload{
		WorkloadIPs: w.Addresses, Waypoint: FromGateway(w.Waypoint), NetworkGateway: FromGateway(w.NetworkGateway),
		Protocol: name(Protocols, w.Protocol), NetworkMode: NetworkStandard,
		UID: w.UID, Name: w.Name, Namespace: w.Namespace, TrustDomain: w.TrustDomain, ServiceAccount: w.ServiceAccount,
		Network: w.Network, WorkloadName: w.WorkloadName, WorkloadType: name(WorkloadTypes, w.WorkloadType),
		CanonicalName: w.CanonicalName, CanonicalRevision: w.CanonicalRevision, Hostname: w.Hostname, Node: w.Node,
		NativeTunnel: w.NativeTunnel, AuthorizationPolicies: w.AuthorizationPolicies, Status: status(w.Healthy),
		ClusterID: w.ClusterID, Locality: w.Locality, Capacity: w.Capacity,
	}
	if out.WorkloadIPs == nil {
		out.WorkloadIPs = []netip.Addr{}
	}
	if w.HostNetwork {
		out.NetworkMode = NetworkHost
	}
	if at := w.ApplicationTunnel; at != nil {
		out.ApplicationTunnel = &ApplicationTunnel{Protocol: name(AppTunnelProtocols, at.Protocol)}
		if at.Port != 0 {
			p := at.Port
			out.ApplicationTunnel.Port = &p
		}
	}
	for _, sp := range w.Services {
		out.Services = append(out.Services, sp.Service)
	}
	return out
}

// FromService converts a service with no endpoints yet.
func FromService(s *state.Service) Service {
	out := Service{
		Name: s.Name, Namespace: s.Namespace, Hostname: s.Hostname, VIPs: []string{},
		Ports: make(map[string]uint16, len(s.Ports)), Endpoints: map[string]Endpoint{}, SubjectAltNames: []string{},
		Waypoint: FromGateway(s.Waypoint), IPFamilies: name(IPFamilies, s.IPFamilies), Canonical: s.Canonical,
		Visibility: name(Visibilities, s.Visibility), IngressUseWaypoint: s.IngressUseWaypoint,
		Extensions: s.Extensions, AliasOf: s.AliasOf,
	}
	for _, v := range s.VIPs {
		if v.Prefix.IsSingleIP() {
			out.VIPs = append(out.VIPs, NetworkIP(v.Network, v.Prefix.Addr()))
		} else {
			out.CIDRVIPs = append(out.CIDRVIPs, v.Network+"/"+v.Prefix.String())
		}
	}
	for _, p := range s.Ports {
		out.Ports[portKey(p.ServicePort)] = p.TargetPort
		if p.AppProtocol != state.AppProtocol(0) {
			if out.AppProtocols == nil {
				out.AppProtocols = map[string]string{}
			}
			out.AppProtocols[portKey(p.ServicePort)] = p.AppProtocol.String()
		}
	}
	for _, id := range s.SubjectAltNames {
		out.SubjectAltNames = append(out.SubjectAltNames, id.String())
	}
	for _, ww := range s.WeightedWaypoints {
		out.WeightedWaypoints = append(out.WeightedWaypoints, WeightedWaypoint{Destination: *FromGateway(&ww.Destination), Weight: ww.Weight})
	}
	if lb := s.LoadBalancing; lb != nil {
		out.LoadBalancer = &LoadBalancer{RoutingPreferences: []string{}, Mode: name(LBModes, lb.Mode), HealthPolicy: name(LBHealthPolicies, lb.HealthPolicy)}
		for _, sc := range lb.RoutingPreference {
			out.LoadBalancer.RoutingPreferences = append(out.LoadBalancer.RoutingPreferences, name(LBScopes, sc))
		}
	}
	return out
}

// FromPolicy converts a policy.
func FromPolicy(p *rbac.Policy) Policy {
	out := Policy{Name: p.Name, Namespace: p.Namespace, Scope: name(Scopes, p.Scope), Action: name(Actions, p.Action),
		Rules: make([][][]Match, 0, len(p.Rules)), DryRun: p.DryRun, Key: p.Key, Audit: p.Audit}
	for _, r := range p.Rules {
		rule := make([][]Match, 0, len(r.Clauses))
		for _, c := range r.Clauses {
			clause := make([]Match, 0, len(c.Matches))
			for _, m := range c.Matches {
				clause = append(clause, fromMatch(m))
			}
			rule = append(rule, clause)
		}
		out.Rules = append(out.Rules, rule)
	}
	return out
}

func fromMatch(m rbac.Match) Match {
	return Match{
		Namespaces: stringMatches(m.Namespaces), NotNamespaces: stringMatches(m.NotNamespaces),
		ServiceAccounts: m.ServiceAccounts, NotServiceAccounts: m.NotServiceAccounts,
		Principals: stringMatches(m.Principals), NotPrincipals: stringMatches(m.NotPrincipals),
		SourceIPs: m.SourceIPs, NotSourceIPs: m.NotSourceIPs, DestinationIPs: m.DestinationIPs, NotDestinationIPs: m.NotDestinationIPs,
		DestinationPorts: m.DestinationPorts, NotDestinationPorts: m.NotDestinationPorts,
	}
}

func stringMatches(in []rbac.StringMatch) []StringMatch {
	if len(in) == 0 {
		return nil
	}
	out := make([]StringMatch, len(in))
	for i, s := range in {
		v := s.Value
		switch s.Kind {
		case rbac.Exact:
			out[i].Exact = &v
		case rbac.Prefix:
			out[i].Prefix = &v
		case rbac.Suffix:
			out[i].Suffix = &v
		default:
			out[i].Presence = &[]string{}
		}
	}
	return out
}

// RBAC converts a string match back; one that sets no kind (or several)
// is an error.
func (s StringMatch) RBAC() (rbac.StringMatch, error) {
	var out []rbac.StringMatch
	if s.Exact != nil {
		out = append(out, rbac.StringMatch{Kind: rbac.Exact, Value: *s.Exact})
	}
	if s.Prefix != nil {
		out = append(out, rbac.StringMatch{Kind: rbac.Prefix, Value: *s.Prefix})
	}
	if s.Suffix != nil {
		out = append(out, rbac.StringMatch{Kind: rbac.Suffix, Value: *s.Suffix})
	}
	if s.Presence != nil {
		out = append(out, rbac.StringMatch{Kind: rbac.Presence})
	}
	if len(out) != 1 {
		return rbac.StringMatch{}, fmt.Errorf("string match sets %d of Exact, Prefix, Suffix, Presence (want 1)", len(out))
	}
	return out[0], nil
}

// Connection is one open connection as the proxy reports it
// (proxy.Connection, without linking the proxy). Addresses are ip:port.
type Connection struct {
	Inbound bool
	// Src is the client; Dst the connection's destination (outbound: the
	// next hop; inbound: where it arrived).
	Src, Dst string
	// OriginalDst is where the application connected (outbound), HBONE the
	// tunnel's inner authority, Service the destination service's hostname.
	OriginalDst, HBONE, Service string
	Tunnelled                   bool
}

// WorkloadStates builds workloadState from the in-pod manager's dump and
// the open connections: each connection goes to the pod proxy of its local
// end (outbound: the source; inbound: the pod served), found by that IP in
// snap on the node's network and matched to a pod proxy by namespace and
// name. Draining proxies go to PodProxies.
func WorkloadStates(d inpodstate.Dump, conns []Connection, snap *state.Snapshot, network, trustDomain string) (map[string]WorkloadState, *PodProxies) {
	out := make(map[string]WorkloadState, len(d.Pods))
	byName := map[[2]string]string{}
	for uid, p := range d.Pods {
		out[uid] = podState(p, trustDomain)
		byName[[2]string{p.Info.Namespace, p.Info.Name}] = uid
	}
	for _, c := range conns {
		local := c.Src
		if c.Inbound {
			local = cmp.Or(c.HBONE, c.Dst)
		}
		ap, err := netip.ParseAddrPort(local)
		if err != nil || snap == nil {
			continue
		}
		w := snap.WorkloadByIP(network, ap.Addr().Unmap())
		if w == nil {
			continue
		}
		uid, ok := byName[[2]string{w.Namespace, w.Name}]
		if !ok {
			continue
		}
		ws := out[uid]
		if ws.Connections == nil {
			ws.Connections = &Connections{Inbound: []InboundConnection{}, Outbound: []OutboundConnection{}}
		}
		proto := "TCP"
		if c.Tunnelled {
			proto = "HBONE"
		}
		if c.Inbound {
			ic := InboundConnection{Src: c.Src, ActualDst: local, Protocol: proto}
			if c.Service != "" {
				s := c.Service
				ic.OriginalDst = &s
			}
			ws.Connections.Inbound = append(ws.Connections.Inbound, ic)
		} else {
			ws.Connections.Outbound = append(ws.Connections.Outbound,
				OutboundConnection{Src: c.Src, OriginalDst: cmp.Or(c.OriginalDst, c.HBONE, c.Dst), ActualDst: c.Dst, Protocol: proto})
		}
		out[uid] = ws
	}
	pp := &PodProxies{SnapshotReceived: d.SnapshotReceived}
	for _, p := range d.Draining {
		pp.Draining = append(pp.Draining, podState(p, trustDomain))
	}
	return out, pp
}

func podState(p inpodstate.PodState, trustDomain string) WorkloadState {
	return WorkloadState{
		State: p.State, Netns: p.Netns, Since: p.Since, LastError: p.LastError,
		Info: WorkloadInfo{Name: p.Info.Name, Namespace: p.Info.Namespace, ServiceAccount: p.Info.ServiceAccount,
			TrustDomain: trustDomain, UID: p.Info.UID},
	}
}
