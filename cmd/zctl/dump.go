package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/certmanager"
	"github.com/ztunnel-go/ztunnel-go/internal/node/inpod/inpodstate"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// dump is the node proxy's /config_dump as zctl reads it. Enums arrive as
// their wire names (the state types print them but do not parse them), so
// the resources are decoded into these mirrors.
type dump struct {
	Generation    uint64                 `json:"generation"`
	Workloads     []workload             `json:"workloads"`
	Services      []service              `json:"services"`
	Policies      []policy               `json:"policies"`
	Certificates  []certmanager.CertDump `json:"certificates"`
	WorkloadState *inpodstate.Dump       `json:"workloadState"`
}

type workload struct {
	UID                   string                `json:"uid"`
	Name                  string                `json:"name"`
	Namespace             string                `json:"namespace"`
	Addresses             []netip.Addr          `json:"addresses"`
	Hostname              string                `json:"hostname"`
	Network               string                `json:"network"`
	Protocol              string                `json:"protocol"`
	NativeTunnel          bool                  `json:"nativeTunnel"`
	TrustDomain           string                `json:"trustDomain"`
	ServiceAccount        string                `json:"serviceAccount"`
	Waypoint              *state.GatewayAddress `json:"waypoint"`
	NetworkGateway        *state.GatewayAddress `json:"networkGateway"`
	Node                  string                `json:"node"`
	CanonicalName         string                `json:"canonicalName"`
	CanonicalRevision     string                `json:"canonicalRevision"`
	WorkloadType          string                `json:"workloadType"`
	WorkloadName          string                `json:"workloadName"`
	Services              []state.ServicePorts  `json:"services"`
	AuthorizationPolicies []string              `json:"authorizationPolicies"`
	Healthy               bool                  `json:"healthy"`
	ClusterID             string                `json:"clusterId"`
	Locality              state.Locality        `json:"locality"`
	HostNetwork           bool                  `json:"hostNetwork"`
	Capacity              uint32                `json:"capacity"`
	// ApplicationTunnel: a sandwiched workload (PROXY protocol inbound).
	ApplicationTunnel *appTunnel `json:"applicationTunnel"`
}

// appTunnel mirrors state.ApplicationTunnel, whose protocol prints by name.
type appTunnel struct {
	Protocol string `json:"protocol"`
	Port     uint32 `json:"port"`
}

type service struct {
	Key             string                 `json:"key"`
	Name            string                 `json:"name"`
	Namespace       string                 `json:"namespace"`
	Hostname        string                 `json:"hostname"`
	VIPs            []state.NetworkAddress `json:"vips"`
	Ports           []port                 `json:"ports"`
	SubjectAltNames []identity.Identity    `json:"subjectAltNames"`
	Waypoint        *state.GatewayAddress  `json:"waypoint"`
	// WeightedWaypoints: a canary set, one drawn per connection.
	WeightedWaypoints []state.WeightedWaypoint `json:"weightedWaypoints"`
	LoadBalancing     *loadBalancing           `json:"loadBalancing"`
	// IPFamilies, Visibility, Canonical and Extensions (an ExternalName
	// alias is one) decide DNS answers.
	IPFamilies string            `json:"ipFamilies"`
	Visibility string            `json:"visibility"`
	Canonical  bool              `json:"canonical"`
	Extensions []state.Extension `json:"extensions"`
}

// loadBalancing mirrors state.LoadBalancing (internalTrafficPolicy and
// trafficDistribution arrive here).
type loadBalancing struct {
	RoutingPreference []string `json:"routingPreference"`
	Mode              string   `json:"mode"`
	HealthPolicy      string   `json:"healthPolicy"`
}

type port struct {
	ServicePort uint16 `json:"servicePort"`
	TargetPort  uint16 `json:"targetPort"`
	AppProtocol string `json:"appProtocol"`
}

type policy struct {
	Key       string `json:"key"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Scope     string `json:"scope"`
	Action    string `json:"action"`
	DryRun    bool   `json:"dryRun"`
	Audit     bool   `json:"audit"`
	Rules     []struct {
		Clauses []struct {
			Matches []match `json:"matches"`
		} `json:"clauses"`
	} `json:"rules"`
}

type match struct {
	Namespaces          []stringMatch         `json:"namespaces"`
	NotNamespaces       []stringMatch         `json:"notNamespaces"`
	Principals          []stringMatch         `json:"principals"`
	NotPrincipals       []stringMatch         `json:"notPrincipals"`
	SourceIPs           []netip.Prefix        `json:"sourceIps"`
	NotSourceIPs        []netip.Prefix        `json:"notSourceIps"`
	DestinationIPs      []netip.Prefix        `json:"destinationIps"`
	NotDestinationIPs   []netip.Prefix        `json:"notDestinationIps"`
	DestinationPorts    []uint16              `json:"destinationPorts"`
	NotDestinationPorts []uint16              `json:"notDestinationPorts"`
	ServiceAccounts     []rbac.ServiceAccount `json:"serviceAccounts"`
	NotServiceAccounts  []rbac.ServiceAccount `json:"notServiceAccounts"`
}

type stringMatch struct {
	Kind  string `json:"kind"`
	Value string `json:"value"`
}

func parseDump(b []byte) (*dump, error) {
	var d dump
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("config dump: %w", err)
	}
	return &d, nil
}

// enumOf finds the value of E whose String() is name, among 0..max.
func enumOf[E interface {
	~uint8
	String() string
}](name string, max E) (E, error) {
	for v := E(0); v <= max; v++ {
		if v.String() == name {
			return v, nil
		}
	}
	return 0, fmt.Errorf("unknown value %q", name)
}

// snapshot rebuilds the node's state from the dump through the same
// conversion xDS updates take (workloads and services back to WDS protos).
// Load-balancing settings, weighted waypoints and application tunnels are
// rebuilt too (the proxy's choices depend on them).
func (d *dump) snapshot() (*state.Snapshot, error) {
	addrs := make(map[string]*workloadapi.Address, len(d.Workloads)+len(d.Services))
	for _, w := range d.Workloads {
		pw := &workloadapi.Workload{
			Uid: w.UID, Name: w.Name, Namespace: w.Namespace, Hostname: w.Hostname, Network: w.Network,
			TunnelProtocol: workloadapi.TunnelProtocol(workloadapi.TunnelProtocol_value[w.Protocol]),
			NativeTunnel:   w.NativeTunnel, TrustDomain: w.TrustDomain, ServiceAccount: w.ServiceAccount,
			Waypoint: gatewayProto(w.Waypoint), NetworkGateway: gatewayProto(w.NetworkGateway), Node: w.Node,
			CanonicalName: w.CanonicalName, CanonicalRevision: w.CanonicalRevision,
			WorkloadType: workloadapi.WorkloadType(workloadapi.WorkloadType_value[w.WorkloadType]),
			WorkloadName: w.WorkloadName, AuthorizationPolicies: w.AuthorizationPolicies, ClusterId: w.ClusterID,
			Locality: &workloadapi.Locality{Region: w.Locality.Region, Zone: w.Locality.Zone, Subzone: w.Locality.Subzone},
			Capacity: wrapperspb.UInt32(w.Capacity),
		}
		for _, a := range w.Addresses {
			pw.Addresses = append(pw.Addresses, a.AsSlice())
		}
		if !w.Healthy {
			pw.Status = workloadapi.WorkloadStatus_UNHEALTHY
		}
		if w.HostNetwork {
			pw.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK
		}
		if at := w.ApplicationTunnel; at != nil {
			p, ok := workloadapi.ApplicationTunnel_Protocol_value[at.Protocol]
			if !ok {
				return nil, fmt.Errorf("workload %s application tunnel: unknown protocol %q", w.UID, at.Protocol)
			}
			pw.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_Protocol(p), Port: at.Port}
		}
		if len(w.Services) > 0 {
			pw.Services = map[string]*workloadapi.PortList{}
		}
		for _, sp := range w.Services {
			pl := &workloadapi.PortList{}
			for _, p := range sp.Ports {
				pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: uint32(p.ServicePort), TargetPort: uint32(p.TargetPort)})
			}
			pw.Services[sp.Service] = pl
		}
		addrs[w.UID] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: pw}}
	}
	for _, s := range d.Services {
		ps := &workloadapi.Service{Name: s.Name, Namespace: s.Namespace, Hostname: s.Hostname, Waypoint: gatewayProto(s.Waypoint)}
		for _, ww := range s.WeightedWaypoints {
			ps.WeightedWaypoints = append(ps.WeightedWaypoints, &workloadapi.WeightedWaypoint{Destination: gatewayProto(&ww.Destination), Weight: ww.Weight})
		}
		for _, v := range s.VIPs {
			na := &workloadapi.NetworkAddress{Network: v.Network, Address: v.Prefix.Addr().AsSlice()}
			if v.Prefix.Bits() != v.Prefix.Addr().BitLen() {
				l := uint32(v.Prefix.Bits())
				na.Length = &l
			}
			ps.Addresses = append(ps.Addresses, na)
		}
		for _, p := range s.Ports {
			ps.Ports = append(ps.Ports, &workloadapi.Port{ServicePort: uint32(p.ServicePort), TargetPort: uint32(p.TargetPort),
				AppProtocol: workloadapi.AppProtocol(workloadapi.AppProtocol_value[p.AppProtocol])})
		}
		if s.IPFamilies != "" {
			f, err := enumOf(s.IPFamilies, state.IPFamiliesDual)
			if err != nil {
				return nil, fmt.Errorf("service %s ip families: %w", s.Key, err)
			}
			ps.IpFamilies = workloadapi.IPFamilies(f)
		}
		if s.Visibility != "" {
			v, err := enumOf(s.Visibility, state.VisibilityNamespace)
			if err != nil {
				return nil, fmt.Errorf("service %s visibility: %w", s.Key, err)
			}
			ps.Visibility = workloadapi.Service_Visibility(v)
		}
		ps.Canonical = s.Canonical
		for _, e := range s.Extensions {
			ps.Extensions = append(ps.Extensions, &workloadapi.Extension{Name: e.Name, Config: &anypb.Any{TypeUrl: e.TypeURL, Value: e.Value}})
		}
		if lb := s.LoadBalancing; lb != nil {
			pl, err := lb.proto()
			if err != nil {
				return nil, fmt.Errorf("service %s load balancing: %w", s.Key, err)
			}
			ps.LoadBalancing = pl
		}
		for _, id := range s.SubjectAltNames {
			ps.SubjectAltNames = append(ps.SubjectAltNames, id.String())
		}
		addrs[s.Key] = &workloadapi.Address{Type: &workloadapi.Address_Service{Service: ps}}
	}
	st := state.NewStore()
	if err := st.ApplyAddresses(addrs, nil); err != nil {
		return nil, fmt.Errorf("rebuilding state from the dump: %w", err)
	}
	authz, err := d.authorizations()
	if err != nil {
		return nil, err
	}
	if err := st.ApplyAuthorizations(authz, nil); err != nil {
		return nil, fmt.Errorf("rebuilding policies from the dump: %w", err)
	}
	return st.Load(), nil
}

// proto converts the dump's wire names back; an unknown one is an error (a
// guessed mode could widen the endpoints the proxy would consider).
func (lb *loadBalancing) proto() (*workloadapi.LoadBalancing, error) {
	mode, err := enumOf(lb.Mode, state.LBModePassthrough)
	if err != nil {
		return nil, fmt.Errorf("mode: %w", err)
	}
	health, err := enumOf(lb.HealthPolicy, state.AllowAll)
	if err != nil {
		return nil, fmt.Errorf("health policy: %w", err)
	}
	out := &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_Mode(mode), HealthPolicy: workloadapi.LoadBalancing_HealthPolicy(health)}
	for _, name := range lb.RoutingPreference {
		sc, err := enumOf(name, state.ScopeNetwork)
		if err != nil {
			return nil, fmt.Errorf("routing preference: %w", err)
		}
		out.RoutingPreference = append(out.RoutingPreference, workloadapi.LoadBalancing_Scope(sc))
	}
	return out, nil
}

func gatewayProto(g *state.GatewayAddress) *workloadapi.GatewayAddress {
	if g == nil {
		return nil
	}
	out := &workloadapi.GatewayAddress{HboneMtlsPort: uint32(g.HBONEPort)}
	if g.IsHostname() {
		out.Destination = &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
			Namespace: g.Hostname.Namespace, Hostname: g.Hostname.Hostname}}
	} else {
		out.Destination = &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{
			Network: g.Address.Network, Address: g.Address.IP.AsSlice()}}
	}
	return out
}

// authorizations rebuilds the dump's policies as the WDS Authorization
// protos they came from, so the store converts them (rbac.FromProto) and
// selects them (Snapshot.PoliciesFor) exactly as on the node.
func (d *dump) authorizations() (map[string]*securityapi.Authorization, error) {
	out := make(map[string]*securityapi.Authorization, len(d.Policies))
	for _, p := range d.Policies {
		scope, err := enumOf(p.Scope, rbac.ScopeWorkloadSelector)
		if err != nil {
			return nil, fmt.Errorf("policy %s scope: %w", p.Key, err)
		}
		action, err := enumOf(p.Action, rbac.Deny)
		if err != nil {
			return nil, fmt.Errorf("policy %s action: %w", p.Key, err)
		}
		a := &securityapi.Authorization{Name: p.Name, Namespace: p.Namespace, Scope: securityapi.Scope(scope),
			Action: securityapi.Action(action), DryRun: p.DryRun}
		if p.Audit {
			a.Extensions = []*securityapi.Extension{{Name: securityapi.AuditExtension}}
		}
		for _, r := range p.Rules {
			pr := &securityapi.Rule{}
			for _, c := range r.Clauses {
				pc := &securityapi.Clause{}
				for _, m := range c.Matches {
					pm, err := m.proto()
					if err != nil {
						return nil, fmt.Errorf("policy %s: %w", p.Key, err)
					}
					pc.Matches = append(pc.Matches, pm)
				}
				pr.Clauses = append(pr.Clauses, pc)
			}
			a.Rules = append(a.Rules, pr)
		}
		out[p.Key] = a
	}
	return out, nil
}

func (m match) proto() (*securityapi.Match, error) {
	var errs []error
	sm := func(in []stringMatch) []*securityapi.StringMatch {
		var out []*securityapi.StringMatch
		for _, s := range in {
			k, err := enumOf(s.Kind, rbac.Presence)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			pm := &securityapi.StringMatch{}
			switch k {
			case rbac.Exact:
				pm.MatchType = &securityapi.StringMatch_Exact{Exact: s.Value}
			case rbac.Prefix:
				pm.MatchType = &securityapi.StringMatch_Prefix{Prefix: s.Value}
			case rbac.Suffix:
				pm.MatchType = &securityapi.StringMatch_Suffix{Suffix: s.Value}
			default:
				pm.MatchType = &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}
			}
			out = append(out, pm)
		}
		return out
	}
	addrs := func(in []netip.Prefix) []*securityapi.Address {
		var out []*securityapi.Address
		for _, p := range in {
			out = append(out, &securityapi.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())})
		}
		return out
	}
	ports := func(in []uint16) []uint32 {
		var out []uint32
		for _, p := range in {
			out = append(out, uint32(p))
		}
		return out
	}
	sas := func(in []rbac.ServiceAccount) []*securityapi.ServiceAccountMatch {
		var out []*securityapi.ServiceAccountMatch
		for _, sa := range in {
			out = append(out, &securityapi.ServiceAccountMatch{Namespace: sa.Namespace, ServiceAccount: sa.ServiceAccount})
		}
		return out
	}
	pm := &securityapi.Match{
		Namespaces: sm(m.Namespaces), NotNamespaces: sm(m.NotNamespaces),
		Principals: sm(m.Principals), NotPrincipals: sm(m.NotPrincipals),
		SourceIps: addrs(m.SourceIPs), NotSourceIps: addrs(m.NotSourceIPs),
		DestinationIps: addrs(m.DestinationIPs), NotDestinationIps: addrs(m.NotDestinationIPs),
		DestinationPorts: ports(m.DestinationPorts), NotDestinationPorts: ports(m.NotDestinationPorts),
		ServiceAccounts: sas(m.ServiceAccounts), NotServiceAccounts: sas(m.NotServiceAccounts),
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("string match kind: %w", errs[0])
	}
	return pm, nil
}

func configDump(out io.Writer, d *dump, from string, names []string, f dumpFilter, format string) error {
	var sections []string
	for _, n := range names {
		if strings.EqualFold(n, "all") {
			sections = append(sections, sectionNames()...)
			continue
		}
		s, ok := sectionOf(n)
		if !ok {
			return fmt.Errorf("unknown section %q (want one of %s, or all)", n, strings.Join(sectionNames(), ", "))
		}
		sections = append(sections, s)
	}
	if len(sections) == 0 {
		sections = sectionNames()
	}
	switch format {
	case "json", "yaml":
		return writeSections(out, d, sections, f, format)
	case "table", "short", "":
	default:
		return fmt.Errorf("unknown output format %q (want table, json or yaml)", format)
	}
	fmt.Fprintf(out, "# node proxy: %s (generation %d)\n", from, d.Generation)
	for i, s := range sections {
		if len(sections) > 1 {
			if i > 0 {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(out, "== %s (generation %d)\n", s, d.Generation)
		}
		if err := render(out, d, s, f); err != nil {
			return err
		}
	}
	return nil
}

// load reads the saved dump o.file, or fetches /config_dump from o.admin,
// and says which one it read.
func load(o options) (*dump, string, error) {
	if o.file != "" {
		b, err := os.ReadFile(o.file)
		if err != nil {
			return nil, "", err
		}
		d, err := parseDump(b)
		return d, "file " + o.file, err
	}
	from := "admin http://" + o.admin + "/config_dump"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+o.admin+"/config_dump", nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("%w (is the node proxy running, and is --admin right?)", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", from, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("GET %s: %s: %s", from, resp.Status, b)
	}
	d, err := parseDump(b)
	return d, from, err
}
