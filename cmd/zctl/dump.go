package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/configdump"
	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// dump is the node proxy's /config_dump as zctl reads it: Istio ztunnel's
// shape (package configdump), the same one istioctl ztunnel-config parses.
type dump struct {
	configdump.Dump
}

func parseDump(b []byte) (*dump, error) {
	var d dump
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("config dump: %w", err)
	}
	return &d, nil
}

// service finds a service of the dump by key ("namespace/hostname").
func (d *dump) service(key string) *configdump.Service {
	for i := range d.Services {
		if d.Services[i].Key() == key {
			return &d.Services[i]
		}
	}
	return nil
}

func parsePort(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("port %q: %w", s, err)
	}
	return uint32(p), nil
}

// portList turns a port map (service port -> target port) back into the
// wire's list, sorted by service port.
func portList(m map[string]uint16, appProtocols map[string]string) ([]*workloadapi.Port, error) {
	out := make([]*workloadapi.Port, 0, len(m))
	for k, target := range m {
		sp, err := parsePort(k)
		if err != nil {
			return nil, err
		}
		p := &workloadapi.Port{ServicePort: sp, TargetPort: uint32(target)}
		if name, ok := appProtocols[k]; ok {
			v, ok := workloadapi.AppProtocol_value[name]
			if !ok {
				return nil, fmt.Errorf("port %s: unknown app protocol %q", k, name)
			}
			p.AppProtocol = workloadapi.AppProtocol(v)
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *workloadapi.Port) int { return cmp.Compare(a.ServicePort, b.ServicePort) })
	return out, nil
}

// snapshot rebuilds the node's state from the dump through the same
// conversion xDS updates take (workloads and services back to WDS protos).
// A workload's ports for a service come from that service's endpoints.
// Load-balancing settings, weighted waypoints and application tunnels are
// rebuilt too (the proxy's choices depend on them). An unknown enum name is
// an error: a guessed value could widen what the rebuilt state allows.
func (d *dump) snapshot() (*state.Snapshot, error) {
	addrs := make(map[string]*workloadapi.Address, len(d.Workloads)+len(d.Services))
	for _, w := range d.Workloads {
		pw, err := d.workloadProto(&w)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", w.UID, err)
		}
		addrs[w.UID] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: pw}}
	}
	for _, s := range d.Services {
		ps, err := serviceProto(&s)
		if err != nil {
			return nil, fmt.Errorf("service %s: %w", s.Key(), err)
		}
		addrs[s.Key()] = &workloadapi.Address{Type: &workloadapi.Address_Service{Service: ps}}
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

func (d *dump) workloadProto(w *configdump.Workload) (*workloadapi.Workload, error) {
	proto, err := configdump.Parse[state.TunnelProtocol](configdump.Protocols, w.Protocol)
	if err != nil {
		return nil, fmt.Errorf("protocol: %w", err)
	}
	pw := &workloadapi.Workload{
		Uid: w.UID, Name: w.Name, Namespace: w.Namespace, Hostname: w.Hostname, Network: w.Network,
		TunnelProtocol: workloadapi.TunnelProtocol(proto),
		NativeTunnel:   w.NativeTunnel, TrustDomain: w.TrustDomain, ServiceAccount: w.ServiceAccount, Node: w.Node,
		CanonicalName: w.CanonicalName, CanonicalRevision: w.CanonicalRevision,
		WorkloadName: w.WorkloadName, AuthorizationPolicies: w.AuthorizationPolicies, ClusterId: w.ClusterID,
		Locality: &workloadapi.Locality{Region: w.Locality.Region, Zone: w.Locality.Zone, Subzone: w.Locality.Subzone},
		Capacity: wrapperspb.UInt32(w.Capacity),
	}
	if pw.Waypoint, err = gatewayProto(w.Waypoint); err != nil {
		return nil, err
	}
	if pw.NetworkGateway, err = gatewayProto(w.NetworkGateway); err != nil {
		return nil, err
	}
	if w.WorkloadType != "" {
		t, err := configdump.Parse[state.WorkloadType](configdump.WorkloadTypes, w.WorkloadType)
		if err != nil {
			return nil, fmt.Errorf("workload type: %w", err)
		}
		pw.WorkloadType = workloadapi.WorkloadType(t)
	}
	for _, a := range w.WorkloadIPs {
		pw.Addresses = append(pw.Addresses, a.AsSlice())
	}
	switch w.Status {
	case configdump.Healthy:
	case configdump.Unhealthy:
		pw.Status = workloadapi.WorkloadStatus_UNHEALTHY
	default:
		return nil, fmt.Errorf("unknown status %q", w.Status)
	}
	switch w.NetworkMode {
	case configdump.NetworkStandard, "":
	case configdump.NetworkHost:
		pw.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK
	default:
		return nil, fmt.Errorf("unknown network mode %q", w.NetworkMode)
	}
	if at := w.ApplicationTunnel; at != nil {
		p, err := configdump.Parse[state.AppTunnelProtocol](configdump.AppTunnelProtocols, at.Protocol)
		if err != nil {
			return nil, fmt.Errorf("application tunnel: %w", err)
		}
		pw.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_Protocol(p)}
		if at.Port != nil {
			pw.ApplicationTunnel.Port = uint32(*at.Port)
		}
	}
	if len(w.Services) > 0 {
		pw.Services = map[string]*workloadapi.PortList{}
	}
	for _, key := range w.Services {
		pl := &workloadapi.PortList{}
		if s := d.service(key); s != nil {
			if ep, ok := s.Endpoints[w.UID]; ok {
				ports, err := portList(ep.Port, nil)
				if err != nil {
					return nil, fmt.Errorf("service %s endpoint: %w", key, err)
				}
				pl.Ports = ports
			}
		}
		pw.Services[key] = pl
	}
	return pw, nil
}

func serviceProto(s *configdump.Service) (*workloadapi.Service, error) {
	ps := &workloadapi.Service{Name: s.Name, Namespace: s.Namespace, Hostname: s.Hostname, Canonical: s.Canonical}
	var err error
	if ps.Waypoint, err = gatewayProto(s.Waypoint); err != nil {
		return nil, err
	}
	for _, ww := range s.WeightedWaypoints {
		g, err := gatewayProto(&ww.Destination)
		if err != nil {
			return nil, err
		}
		ps.WeightedWaypoints = append(ps.WeightedWaypoints, &workloadapi.WeightedWaypoint{Destination: g, Weight: ww.Weight})
	}
	for _, v := range s.VIPs {
		network, ip, err := configdump.ParseNetworkIP(v)
		if err != nil {
			return nil, fmt.Errorf("vip: %w", err)
		}
		ps.Addresses = append(ps.Addresses, &workloadapi.NetworkAddress{Network: network, Address: ip.AsSlice()})
	}
	for _, v := range s.CIDRVIPs {
		network, p, err := configdump.ParseNetworkPrefix(v)
		if err != nil {
			return nil, fmt.Errorf("cidr vip: %w", err)
		}
		l := uint32(p.Bits())
		ps.Addresses = append(ps.Addresses, &workloadapi.NetworkAddress{Network: network, Address: p.Addr().AsSlice(), Length: &l})
	}
	if ps.Ports, err = portList(s.Ports, s.AppProtocols); err != nil {
		return nil, err
	}
	if s.IPFamilies != "" {
		f, err := configdump.Parse[state.IPFamilies](configdump.IPFamilies, s.IPFamilies)
		if err != nil {
			return nil, fmt.Errorf("ip families: %w", err)
		}
		ps.IpFamilies = workloadapi.IPFamilies(f)
	}
	if s.Visibility != "" {
		v, err := configdump.Parse[state.Visibility](configdump.Visibilities, s.Visibility)
		if err != nil {
			return nil, fmt.Errorf("visibility: %w", err)
		}
		ps.Visibility = workloadapi.Service_Visibility(v)
	}
	for _, e := range s.Extensions {
		ps.Extensions = append(ps.Extensions, &workloadapi.Extension{Name: e.Name, Config: &anypb.Any{TypeUrl: e.TypeURL, Value: e.Value}})
	}
	if lb := s.LoadBalancer; lb != nil {
		pl, err := lbProto(lb)
		if err != nil {
			return nil, fmt.Errorf("load balancing: %w", err)
		}
		ps.LoadBalancing = pl
	}
	ps.SubjectAltNames = append(ps.SubjectAltNames, s.SubjectAltNames...)
	return ps, nil
}

// lbProto converts the dump's names back; an unknown one is an error (a
// guessed mode could widen the endpoints the proxy would consider).
func lbProto(lb *configdump.LoadBalancer) (*workloadapi.LoadBalancing, error) {
	mode, err := configdump.Parse[state.LBMode](configdump.LBModes, lb.Mode)
	if err != nil {
		return nil, fmt.Errorf("mode: %w", err)
	}
	health, err := configdump.Parse[state.LBHealthPolicy](configdump.LBHealthPolicies, lb.HealthPolicy)
	if err != nil {
		return nil, fmt.Errorf("health policy: %w", err)
	}
	out := &workloadapi.LoadBalancing{Mode: workloadapi.LoadBalancing_Mode(mode), HealthPolicy: workloadapi.LoadBalancing_HealthPolicy(health)}
	for _, name := range lb.RoutingPreferences {
		sc, err := configdump.Parse[state.LBScope](configdump.LBScopes, name)
		if err != nil {
			return nil, fmt.Errorf("routing preference: %w", err)
		}
		out.RoutingPreference = append(out.RoutingPreference, workloadapi.LoadBalancing_Scope(sc))
	}
	return out, nil
}

func gatewayProto(g *configdump.GatewayAddress) (*workloadapi.GatewayAddress, error) {
	sg, err := g.Gateway()
	if err != nil || sg == nil {
		return nil, err
	}
	out := &workloadapi.GatewayAddress{HboneMtlsPort: uint32(sg.HBONEPort)}
	if sg.IsHostname() {
		out.Destination = &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{
			Namespace: sg.Hostname.Namespace, Hostname: sg.Hostname.Hostname}}
	} else {
		out.Destination = &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{
			Network: sg.Address.Network, Address: sg.Address.IP.AsSlice()}}
	}
	return out, nil
}

// authorizations rebuilds the dump's policies as the WDS Authorization
// protos they came from, so the store converts them (rbac.FromProto) and
// selects them (Snapshot.PoliciesFor) exactly as on the node.
func (d *dump) authorizations() (map[string]*securityapi.Authorization, error) {
	out := make(map[string]*securityapi.Authorization, len(d.Policies))
	for _, p := range d.Policies {
		key := cmp.Or(p.Key, p.Namespace+"/"+p.Name)
		scope, err := configdump.Parse[rbac.Scope](configdump.Scopes, p.Scope)
		if err != nil {
			return nil, fmt.Errorf("policy %s scope: %w", key, err)
		}
		action, err := configdump.Parse[rbac.Action](configdump.Actions, p.Action)
		if err != nil {
			return nil, fmt.Errorf("policy %s action: %w", key, err)
		}
		a := &securityapi.Authorization{Name: p.Name, Namespace: p.Namespace, Scope: securityapi.Scope(scope),
			Action: securityapi.Action(action), DryRun: p.DryRun}
		if p.Audit {
			a.Extensions = []*securityapi.Extension{{Name: securityapi.AuditExtension}}
		}
		for _, r := range p.Rules {
			pr := &securityapi.Rule{}
			for _, c := range r {
				pc := &securityapi.Clause{}
				for _, m := range c {
					pm, err := matchProto(m)
					if err != nil {
						return nil, fmt.Errorf("policy %s: %w", key, err)
					}
					pc.Matches = append(pc.Matches, pm)
				}
				pr.Clauses = append(pr.Clauses, pc)
			}
			a.Rules = append(a.Rules, pr)
		}
		out[key] = a
	}
	return out, nil
}

func matchProto(m configdump.Match) (*securityapi.Match, error) {
	var errs []error
	sm := func(in []configdump.StringMatch) []*securityapi.StringMatch {
		var out []*securityapi.StringMatch
		for _, s := range in {
			rs, err := s.RBAC()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			pm := &securityapi.StringMatch{}
			switch rs.Kind {
			case rbac.Exact:
				pm.MatchType = &securityapi.StringMatch_Exact{Exact: rs.Value}
			case rbac.Prefix:
				pm.MatchType = &securityapi.StringMatch_Prefix{Prefix: rs.Value}
			case rbac.Suffix:
				pm.MatchType = &securityapi.StringMatch_Suffix{Suffix: rs.Value}
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
		return nil, errs[0]
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
