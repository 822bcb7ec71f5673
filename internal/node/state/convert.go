package state

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// ResourceError is the rejection of one xDS resource: which one, which field,
// and why.
type ResourceError struct {
	// Resource is the xDS resource name.
	Resource string
	// Field is a path in proto field names ("addresses[1]",
	// "services[\"ns/h\"].ports[0].target_port"); "" when the resource as a
	// whole is wrong.
	Field string
	Err   error
}

func (e *ResourceError) Error() string {
	if e.Field == "" {
		return "resource " + e.Resource + ": " + e.Err.Error()
	}
	return "resource " + e.Resource + ": field " + e.Field + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *ResourceError) Unwrap() error { return e.Err }

// ApplyError lists the resources an Apply call rejected (sorted by name). The
// other resources of the same call were applied, and each rejected resource
// kept its previous version.
type ApplyError struct {
	Errors []*ResourceError
}

func (e *ApplyError) Error() string {
	var b strings.Builder
	b.WriteString("state: rejected ")
	b.WriteString(strconv.Itoa(len(e.Errors)))
	b.WriteString(" resource(s): ")
	for i, re := range e.Errors {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(re.Error())
	}
	return b.String()
}

// Unwrap returns the per-resource errors.
func (e *ApplyError) Unwrap() []error {
	out := make([]error, len(e.Errors))
	for i, re := range e.Errors {
		out[i] = re
	}
	return out
}

// fieldError is a conversion failure inside one resource; the Apply call adds
// the resource name.
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return "field " + e.field + ": " + e.err.Error() }

func ferr(field, format string, args ...any) error {
	return &fieldError{field: field, err: fmt.Errorf(format, args...)}
}

func resourceError(name string, err error) *ResourceError {
	var fe *fieldError
	if errors.As(err, &fe) {
		return &ResourceError{Resource: name, Field: fe.field, Err: fe.err}
	}
	return &ResourceError{Resource: name, Err: err}
}

// interner deduplicates strings that repeat across resources. It keeps two
// generations: when the current one fills up it becomes the previous one and
// strings unused since are forgotten, so memory stays bounded by about twice
// the live set without reference counting. Used under the Store's writer lock.
type interner struct {
	// validateOnly interners (parallel conversion workers) do not intern:
	// the results are interned afterwards by the store's interner.
	validateOnly bool

	cur, prev map[string]string
	limit     int
	// Validation caches for SPIFFE pieces, reset with each generation.
	tdErr, segErr map[string]error
}

const minInternLimit = 4096

func (in *interner) intern(s string) string {
	if s == "" || in.validateOnly {
		return s
	}
	if v, ok := in.cur[s]; ok {
		return v
	}
	if v, ok := in.prev[s]; ok {
		in.cur[v] = v
		return v
	}
	if in.cur == nil || len(in.cur) >= in.limit {
		in.prev = in.cur
		in.limit = max(minInternLimit, 2*len(in.prev))
		in.cur = make(map[string]string, in.limit/2)
		in.tdErr = map[string]error{}
		in.segErr = map[string]error{}
	}
	// No strings.Clone: decoded protobuf strings are their own allocations,
	// not views into a larger buffer.
	in.cur[s] = s
	return s
}

func (in *interner) checkTrustDomain(td string) error {
	if in.tdErr == nil {
		in.tdErr = map[string]error{}
	}
	if err, ok := in.tdErr[td]; ok {
		return err
	}
	t, err := spiffeid.TrustDomainFromString(td)
	if err == nil && t.Name() != td {
		err = fmt.Errorf("%q is not a bare trust domain name", td)
	}
	in.tdErr[td] = err
	return err
}

func (in *interner) checkSegment(s string) error {
	if in.segErr == nil {
		in.segErr = map[string]error{}
	}
	if err, ok := in.segErr[s]; ok {
		return err
	}
	err := spiffeid.ValidatePathSegment(s)
	in.segErr[s] = err
	return err
}

// Field paths are built only on failure: conversion of a valid resource
// allocates nothing but the converted value.

func convIP(b []byte) (netip.Addr, bool) {
	ip, ok := netip.AddrFromSlice(b)
	return ip.Unmap(), ok
}

func badIP(field string, b []byte) error {
	return ferr(field, "IP is %d bytes, want 4 or 16", len(b))
}

func convPort(p uint32, field string) (uint16, error) {
	if p > 65535 {
		return 0, ferr(field, "port %d out of range", p)
	}
	return uint16(p), nil
}

func idx(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

// workloadBlock co-allocates a workload with the backing arrays of its
// common-case slices (one address, one service, two ports): one allocation
// and less size-class rounding per workload.
type workloadBlock struct {
	w     Workload
	addr  [1]netip.Addr
	svc   [1]ServicePorts
	ports [2]PortMapping
}

func (in *interner) workload(pw *workloadapi.Workload) (*Workload, error) {
	if pw.GetUid() == "" {
		return nil, ferr("uid", "required")
	}
	if pw.GetName() == "" {
		return nil, ferr("name", "required")
	}
	if pw.GetNamespace() == "" {
		return nil, ferr("namespace", "required")
	}
	blk := &workloadBlock{}
	w := &blk.w
	*w = Workload{
		UID:               pw.GetUid(),
		Name:              pw.GetName(),
		Namespace:         in.intern(pw.GetNamespace()),
		Hostname:          pw.GetHostname(),
		Network:           in.intern(pw.GetNetwork()),
		NativeTunnel:      pw.GetNativeTunnel(),
		TrustDomain:       in.intern(pw.GetTrustDomain()),
		ServiceAccount:    in.intern(pw.GetServiceAccount()),
		Node:              in.intern(pw.GetNode()),
		CanonicalName:     in.intern(pw.GetCanonicalName()),
		CanonicalRevision: in.intern(pw.GetCanonicalRevision()),
		WorkloadName:      in.intern(pw.GetWorkloadName()),
		ClusterID:         in.intern(pw.GetClusterId()),
		Capacity:          1,
	}
	switch pw.GetTunnelProtocol() {
	case workloadapi.TunnelProtocol_NONE:
		w.Protocol = TunnelNone
	case workloadapi.TunnelProtocol_HBONE:
		w.Protocol = TunnelHBONE
	case workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS:
		return nil, ferr("tunnel_protocol", "LEGACY_ISTIO_MTLS is not supported")
	default:
		return nil, ferr("tunnel_protocol", "unknown value %d", int32(pw.GetTunnelProtocol()))
	}
	if w.TrustDomain == "" {
		w.TrustDomain = identity.DefaultTrustDomain
	}
	if w.ServiceAccount == "" {
		w.ServiceAccount = DefaultServiceAccount
	}
	if err := in.checkTrustDomain(w.TrustDomain); err != nil {
		return nil, ferr("trust_domain", "%w", err)
	}
	if err := in.checkSegment(w.Namespace); err != nil {
		return nil, ferr("namespace", "not a SPIFFE path segment: %w", err)
	}
	if err := in.checkSegment(w.ServiceAccount); err != nil {
		return nil, ferr("service_account", "not a SPIFFE path segment: %w", err)
	}
	if n := len(pw.GetAddresses()); n > 0 {
		if n <= len(blk.addr) {
			w.Addresses = blk.addr[:n:n]
		} else {
			w.Addresses = make([]netip.Addr, n)
		}
		for i, b := range pw.GetAddresses() {
			ip, ok := convIP(b)
			if !ok {
				return nil, badIP(idx("addresses", i), b)
			}
			w.Addresses[i] = ip
		}
	}
	var err error
	if pw.GetWaypoint() != nil {
		if w.Waypoint, err = in.gateway(pw.GetWaypoint(), "waypoint"); err != nil {
			return nil, err
		}
	}
	if pw.GetNetworkGateway() != nil {
		if w.NetworkGateway, err = in.gateway(pw.GetNetworkGateway(), "network_gateway"); err != nil {
			return nil, err
		}
	}
	switch t := pw.GetWorkloadType(); t {
	case workloadapi.WorkloadType_DEPLOYMENT, workloadapi.WorkloadType_CRONJOB, workloadapi.WorkloadType_POD, workloadapi.WorkloadType_JOB:
		w.WorkloadType = WorkloadType(t)
	default:
		return nil, ferr("workload_type", "unknown value %d", int32(t))
	}
	if at := pw.GetApplicationTunnel(); at != nil {
		w.ApplicationTunnel = &ApplicationTunnel{}
		switch at.GetProtocol() {
		case workloadapi.ApplicationTunnel_NONE:
			w.ApplicationTunnel.Protocol = AppTunnelNone
		case workloadapi.ApplicationTunnel_PROXY:
			w.ApplicationTunnel.Protocol = AppTunnelProxy
		default:
			return nil, ferr("application_tunnel.protocol", "unknown value %d", int32(at.GetProtocol()))
		}
		if w.ApplicationTunnel.Port, err = convPort(at.GetPort(), "application_tunnel.port"); err != nil {
			return nil, err
		}
	}
	if svcs := pw.GetServices(); len(svcs) > 0 {
		if len(svcs) <= len(blk.svc) {
			w.Services = blk.svc[:0:len(svcs)]
		} else {
			w.Services = make([]ServicePorts, 0, len(svcs))
		}
		portsFree := blk.ports[:]
		for key, pl := range svcs {
			field := func() string { return "services[" + strconv.Quote(key) + "]" }
			if ns, host, ok := strings.Cut(key, "/"); !ok || ns == "" || host == "" {
				return nil, ferr(field(), "key is not namespace/hostname")
			}
			sp := ServicePorts{Service: in.intern(key)}
			if n := len(pl.GetPorts()); n > 0 {
				if n <= len(portsFree) {
					sp.Ports, portsFree = portsFree[:n:n], portsFree[n:]
				} else {
					sp.Ports = make([]PortMapping, n)
				}
				for i, p := range pl.GetPorts() {
					if p.GetServicePort() > 65535 || p.GetTargetPort() > 65535 || p.GetAppProtocol() < 0 || p.GetAppProtocol() > workloadapi.AppProtocol_TLS {
						pf := idx(field()+".ports", i)
						if _, err := convPort(p.GetServicePort(), pf+".service_port"); err != nil {
							return nil, err
						}
						if _, err := convPort(p.GetTargetPort(), pf+".target_port"); err != nil {
							return nil, err
						}
						_, err := appProtocol(p.GetAppProtocol(), pf+".app_protocol")
						return nil, err
					}
					sp.Ports[i] = PortMapping{ServicePort: uint16(p.GetServicePort()), TargetPort: uint16(p.GetTargetPort())}
				}
			}
			w.Services = append(w.Services, sp)
		}
		slices.SortFunc(w.Services, func(a, b ServicePorts) int { return strings.Compare(a.Service, b.Service) })
	}
	if n := len(pw.GetAuthorizationPolicies()); n > 0 {
		w.AuthorizationPolicies = make([]string, n)
		for i, k := range pw.GetAuthorizationPolicies() {
			if ns, name, ok := strings.Cut(k, "/"); !ok || ns == "" || name == "" {
				return nil, ferr(idx("authorization_policies", i), "%q is not namespace/name", k)
			}
			w.AuthorizationPolicies[i] = in.intern(k)
		}
	}
	switch pw.GetStatus() {
	case workloadapi.WorkloadStatus_HEALTHY:
		w.Healthy = true
	case workloadapi.WorkloadStatus_UNHEALTHY:
	default:
		return nil, ferr("status", "unknown value %d", int32(pw.GetStatus()))
	}
	if l := pw.GetLocality(); l != nil {
		w.Locality = Locality{Region: in.intern(l.GetRegion()), Zone: in.intern(l.GetZone()), Subzone: in.intern(l.GetSubzone())}
	}
	switch pw.GetNetworkMode() {
	case workloadapi.NetworkMode_STANDARD:
	case workloadapi.NetworkMode_HOST_NETWORK:
		w.HostNetwork = true
	default:
		return nil, ferr("network_mode", "unknown value %d", int32(pw.GetNetworkMode()))
	}
	if c := pw.GetCapacity(); c != nil {
		w.Capacity = c.GetValue()
	}
	return w, nil
}

func appProtocol(p workloadapi.AppProtocol, field string) (AppProtocol, error) {
	if p < 0 || p > workloadapi.AppProtocol_TLS {
		return 0, ferr(field, "unknown value %d", int32(p))
	}
	return AppProtocol(p), nil
}

func (in *interner) gateway(g *workloadapi.GatewayAddress, field string) (*GatewayAddress, error) {
	out := &GatewayAddress{HBONEPort: DefaultHBONEPort}
	switch d := g.GetDestination().(type) {
	case *workloadapi.GatewayAddress_Hostname:
		if d.Hostname.GetNamespace() == "" {
			return nil, ferr(field+".hostname.namespace", "required")
		}
		if d.Hostname.GetHostname() == "" {
			return nil, ferr(field+".hostname.hostname", "required")
		}
		out.Hostname = NamespacedHostname{Namespace: in.intern(d.Hostname.GetNamespace()), Hostname: in.intern(d.Hostname.GetHostname())}
	case *workloadapi.GatewayAddress_Address:
		ip, ok := convIP(d.Address.GetAddress())
		if !ok {
			return nil, badIP(field+".address.address", d.Address.GetAddress())
		}
		out.Address = NetworkIP{Network: in.intern(d.Address.GetNetwork()), IP: ip}
	default:
		return nil, ferr(field, "no destination (want hostname or address)")
	}
	if p := g.GetHboneMtlsPort(); p != 0 {
		port, err := convPort(p, field+".hbone_mtls_port")
		if err != nil {
			return nil, err
		}
		out.HBONEPort = port
	}
	return out, nil
}

func (in *interner) service(ps *workloadapi.Service) (*Service, error) {
	if ps.GetName() == "" {
		return nil, ferr("name", "required")
	}
	if ps.GetNamespace() == "" {
		return nil, ferr("namespace", "required")
	}
	if ps.GetHostname() == "" {
		return nil, ferr("hostname", "required")
	}
	s := &Service{
		Name:               ps.GetName(),
		Namespace:          in.intern(ps.GetNamespace()),
		Hostname:           in.intern(ps.GetHostname()),
		Canonical:          ps.GetCanonical(),
		IngressUseWaypoint: ps.GetIngressUseWaypoint(),
	}
	s.Key = in.intern(s.Namespace + "/" + s.Hostname)
	if n := len(ps.GetAddresses()); n > 0 {
		s.VIPs = make([]NetworkAddress, n)
		for i, a := range ps.GetAddresses() {
			ip, ok := convIP(a.GetAddress())
			if !ok {
				return nil, badIP(idx("addresses", i)+".address", a.GetAddress())
			}
			bits := ip.BitLen()
			if a.Length != nil {
				if a.GetLength() > uint32(ip.BitLen()) {
					return nil, ferr(idx("addresses", i)+".length", "%d is longer than the %d-bit address", a.GetLength(), ip.BitLen())
				}
				bits = int(a.GetLength())
			}
			s.VIPs[i] = NetworkAddress{Network: in.intern(a.GetNetwork()), Prefix: netip.PrefixFrom(ip, bits).Masked()}
		}
	}
	if n := len(ps.GetPorts()); n > 0 {
		s.Ports = make([]Port, n)
		var err error
		for i, p := range ps.GetPorts() {
			field := idx("ports", i)
			if s.Ports[i].ServicePort, err = convPort(p.GetServicePort(), field+".service_port"); err != nil {
				return nil, err
			}
			if s.Ports[i].TargetPort, err = convPort(p.GetTargetPort(), field+".target_port"); err != nil {
				return nil, err
			}
			if s.Ports[i].AppProtocol, err = appProtocol(p.GetAppProtocol(), field+".app_protocol"); err != nil {
				return nil, err
			}
		}
	}
	for _, san := range ps.GetSubjectAltNames() {
		// Invalid SANs are ignored, as ztunnel does.
		if id, err := identity.Parse(san); err == nil {
			s.SubjectAltNames = append(s.SubjectAltNames, identity.Identity{
				TrustDomain: in.intern(id.TrustDomain), Namespace: in.intern(id.Namespace), ServiceAccount: in.intern(id.ServiceAccount)})
		}
	}
	var err error
	if ps.GetWaypoint() != nil {
		if s.Waypoint, err = in.gateway(ps.GetWaypoint(), "waypoint"); err != nil {
			return nil, err
		}
	}
	for i, ww := range ps.GetWeightedWaypoints() {
		field := "weighted_waypoints[" + strconv.Itoa(i) + "]"
		if ww.GetDestination() == nil {
			return nil, ferr(field+".destination", "required")
		}
		g, err := in.gateway(ww.GetDestination(), field+".destination")
		if err != nil {
			return nil, err
		}
		s.WeightedWaypoints = append(s.WeightedWaypoints, WeightedWaypoint{Destination: *g, Weight: ww.GetWeight()})
	}
	if lb := ps.GetLoadBalancing(); lb != nil {
		s.LoadBalancing = &LoadBalancing{}
		for i, sc := range lb.GetRoutingPreference() {
			if sc <= workloadapi.LoadBalancing_UNSPECIFIED_SCOPE || sc > workloadapi.LoadBalancing_NETWORK {
				return nil, ferr("load_balancing.routing_preference["+strconv.Itoa(i)+"]", "unknown value %d", int32(sc))
			}
			s.LoadBalancing.RoutingPreference = append(s.LoadBalancing.RoutingPreference, LBScope(sc))
		}
		if m := lb.GetMode(); m < 0 || m > workloadapi.LoadBalancing_PASSTHROUGH {
			return nil, ferr("load_balancing.mode", "unknown value %d", int32(m))
		}
		s.LoadBalancing.Mode = LBMode(lb.GetMode())
		if h := lb.GetHealthPolicy(); h < 0 || h > workloadapi.LoadBalancing_ALLOW_ALL {
			return nil, ferr("load_balancing.health_policy", "unknown value %d", int32(h))
		}
		s.LoadBalancing.HealthPolicy = LBHealthPolicy(lb.GetHealthPolicy())
		if d := lb.GetDnsConnectStrategy(); d < 0 || d > workloadapi.LoadBalancing_FIRST_HEALTHY_RACE {
			return nil, ferr("load_balancing.dns_connect_strategy", "unknown value %d", int32(d))
		}
	}
	if f := ps.GetIpFamilies(); f < 0 || f > workloadapi.IPFamilies_DUAL {
		return nil, ferr("ip_families", "unknown value %d", int32(f))
	}
	s.IPFamilies = IPFamilies(ps.GetIpFamilies())
	if v := ps.GetVisibility(); v < 0 || v > workloadapi.Service_NAMESPACE {
		return nil, ferr("visibility", "unknown value %d", int32(v))
	}
	s.Visibility = Visibility(ps.GetVisibility())
	for i, e := range ps.GetExtensions() {
		field := "extensions[" + strconv.Itoa(i) + "]"
		ext := Extension{Name: e.GetName(), TypeURL: e.GetConfig().GetTypeUrl(), Value: e.GetConfig().GetValue()}
		if ext.Name == ExternalNameAliasExtension {
			if e.GetConfig() == nil {
				return nil, ferr(field+".config", "required for %s", ExternalNameAliasExtension)
			}
			var sv wrapperspb.StringValue
			if err := e.GetConfig().UnmarshalTo(&sv); err != nil {
				return nil, ferr(field+".config", "want google.protobuf.StringValue: %w", err)
			}
			if sv.GetValue() == "" {
				return nil, ferr(field+".config", "empty alias target")
			}
			s.AliasOf = sv.GetValue()
		}
		if ext.Name == ExportToExtension {
			var sv wrapperspb.StringValue
			if err := e.GetConfig().UnmarshalTo(&sv); e.GetConfig() == nil || err != nil {
				return nil, ferr(field+".config", "want google.protobuf.StringValue for %s", ExportToExtension)
			}
			for _, n := range strings.Split(sv.GetValue(), ",") {
				if n != "" {
					s.ExportTo = append(s.ExportTo, in.intern(n))
				}
			}
		}
		if ext.Name == GlobalScopeExtension {
			s.Global = true
		}
		s.Extensions = append(s.Extensions, ext)
	}
	return s, nil
}

// canonWorkload re-interns w's shared strings through in. Bulk conversion
// runs in parallel with per-worker interners; this makes the result share
// storage with everything else the store holds.
func (in *interner) canonWorkload(w *Workload) {
	for _, p := range []*string{&w.Namespace, &w.Network, &w.TrustDomain, &w.ServiceAccount, &w.Node,
		&w.CanonicalName, &w.CanonicalRevision, &w.WorkloadName, &w.ClusterID,
		&w.Locality.Region, &w.Locality.Zone, &w.Locality.Subzone} {
		*p = in.intern(*p)
	}
	for i := range w.Services {
		w.Services[i].Service = in.intern(w.Services[i].Service)
	}
	for i := range w.AuthorizationPolicies {
		w.AuthorizationPolicies[i] = in.intern(w.AuthorizationPolicies[i])
	}
	in.canonGateway(w.Waypoint)
	in.canonGateway(w.NetworkGateway)
}

func (in *interner) canonGateway(g *GatewayAddress) {
	if g == nil {
		return
	}
	g.Hostname.Namespace = in.intern(g.Hostname.Namespace)
	g.Hostname.Hostname = in.intern(g.Hostname.Hostname)
	g.Address.Network = in.intern(g.Address.Network)
}

// canonService is canonWorkload for services.
func (in *interner) canonService(s *Service) {
	s.Namespace = in.intern(s.Namespace)
	s.Hostname = in.intern(s.Hostname)
	s.Key = in.intern(s.Key)
	for i := range s.VIPs {
		s.VIPs[i].Network = in.intern(s.VIPs[i].Network)
	}
	for i := range s.SubjectAltNames {
		id := &s.SubjectAltNames[i]
		id.TrustDomain, id.Namespace, id.ServiceAccount = in.intern(id.TrustDomain), in.intern(id.Namespace), in.intern(id.ServiceAccount)
	}
	in.canonGateway(s.Waypoint)
	for i := range s.WeightedWaypoints {
		in.canonGateway(&s.WeightedWaypoints[i].Destination)
	}
}
