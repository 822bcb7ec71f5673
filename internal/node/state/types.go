package state

import (
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Default values Istio elides on the wire.
const (
	// DefaultServiceAccount is a workload's service account when none is sent.
	DefaultServiceAccount = "default"
	// DefaultHBONEPort is a GatewayAddress's HBONE port when none is sent.
	DefaultHBONEPort = 15008
)

// Workload is one converted istio.workload.Workload. It is immutable once
// published in a Snapshot and shared by every snapshot that still holds it.
// Strings that repeat across workloads (namespace, network, node, trust
// domain, service account, cluster, locality, canonical and workload names,
// service and policy keys) are interned.
type Workload struct {
	// UID is the xDS resource name (pods: "<cluster>//Pod/<ns>/<name>").
	UID       string `json:"uid"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Addresses are the workload's IPs (IPv4 unmapped). Empty for workloads
	// reached by Hostname or through a network gateway.
	Addresses []netip.Addr `json:"addresses,omitempty"`
	// Hostname is resolved by DNS on demand when Addresses is empty.
	Hostname string `json:"hostname,omitempty"`
	// Network is "" for the default network.
	Network string `json:"network,omitempty"`
	// Protocol is how to reach the workload: plain TCP or HBONE.
	Protocol TunnelProtocol `json:"protocol"`
	// NativeTunnel: the workload terminates HBONE itself (for example a
	// waypoint), so traffic to it does not go through its node's ztunnel.
	NativeTunnel bool `json:"nativeTunnel,omitempty"`
	// TrustDomain and ServiceAccount with Istio's defaults applied
	// (cluster.local, "default"); see Identity.
	TrustDomain    string `json:"trustDomain"`
	ServiceAccount string `json:"serviceAccount"`
	// Waypoint is the workload's waypoint; nil means none.
	Waypoint *GatewayAddress `json:"waypoint,omitempty"`
	// NetworkGateway is the east-west gateway for reaching this workload from
	// another network; nil means none.
	NetworkGateway    *GatewayAddress `json:"networkGateway,omitempty"`
	Node              string          `json:"node,omitempty"`
	CanonicalName     string          `json:"canonicalName,omitempty"`
	CanonicalRevision string          `json:"canonicalRevision,omitempty"`
	WorkloadType      WorkloadType    `json:"workloadType"`
	WorkloadName      string          `json:"workloadName,omitempty"`
	// ApplicationTunnel is set for sandwiched workloads (waypoints behind a
	// ztunnel); nil means the workload accepts no application tunnel.
	ApplicationTunnel *ApplicationTunnel `json:"applicationTunnel,omitempty"`
	// Services lists the services this workload is an endpoint of, sorted by
	// service key, each with the workload's resolved ports for it.
	Services []ServicePorts `json:"services,omitempty"`
	// AuthorizationPolicies are the WORKLOAD_SELECTOR policy keys
	// ("ns/name") selecting this workload, as istiod computed them.
	AuthorizationPolicies []string `json:"authorizationPolicies,omitempty"`
	// Healthy is false for pods that are not Ready or are terminating.
	Healthy   bool     `json:"healthy"`
	ClusterID string   `json:"clusterId,omitempty"`
	Locality  Locality `json:"locality"`
	// HostNetwork workloads share the node's IP and are never looked up by
	// IP.
	HostNetwork bool `json:"hostNetwork,omitempty"`
	// Capacity is the load-balancing weight (default 1; 0 is never picked).
	Capacity uint32 `json:"capacity"`
}

// Identity is the workload's SPIFFE identity.
func (w *Workload) Identity() identity.Identity {
	return identity.Identity{TrustDomain: w.TrustDomain, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount}
}

// PortsFor returns the workload's port list for the service key
// ("ns/hostname"), or nil.
func (w *Workload) PortsFor(serviceKey string) []PortMapping {
	for i := range w.Services {
		if w.Services[i].Service == serviceKey {
			return w.Services[i].Ports
		}
	}
	return nil
}

// ServicePorts is one entry of Workload.Services.
type ServicePorts struct {
	// Service is the service key "namespace/hostname".
	Service string        `json:"service"`
	Ports   []PortMapping `json:"ports,omitempty"`
}

// PortMapping maps a service port to this workload's target port (0 = not
// resolved).
type PortMapping struct {
	ServicePort uint16 `json:"servicePort"`
	TargetPort  uint16 `json:"targetPort"`
}

// Locality is a workload's topology position.
type Locality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	Subzone string `json:"subzone,omitempty"`
}

// ApplicationTunnel says how a sandwiched workload accepts tunnelled
// traffic.
type ApplicationTunnel struct {
	Protocol AppTunnelProtocol `json:"protocol"`
	// Port is the port to send tunnelled traffic to; 0 = the target port.
	Port uint16 `json:"port,omitempty"`
}

// NamespacedHostname names a service.
type NamespacedHostname struct {
	Namespace string `json:"namespace"`
	Hostname  string `json:"hostname"`
}

// Key is the service key "namespace/hostname".
func (n NamespacedHostname) Key() string { return n.Namespace + "/" + n.Hostname }

// NetworkAddress is an IP (or, for service VIPs, a CIDR) on a network.
type NetworkAddress struct {
	// Network is "" for the default network.
	Network string `json:"network,omitempty"`
	// Prefix is the address; single IPs are /32 or /128.
	Prefix netip.Prefix `json:"prefix"`
}

// GatewayAddress is a waypoint or network gateway: either a service by
// hostname (Hostname set) or an address (Address set), never both.
type GatewayAddress struct {
	// Hostname is set (non-empty Hostname.Hostname) when the gateway is named
	// by its service.
	Hostname NamespacedHostname `json:"hostname,omitzero"`
	// Address is set (valid Address.IP) when the gateway is named by IP.
	Address NetworkIP `json:"address,omitzero"`
	// HBONEPort is the gateway's HBONE (mTLS) port, default 15008.
	HBONEPort uint16 `json:"hbonePort"`
}

// IsHostname reports whether the gateway is named by its service hostname.
func (g *GatewayAddress) IsHostname() bool { return g.Hostname.Hostname != "" }

// Port is the gateway's HBONE port: HBONEPort, else DefaultHBONEPort.
func (g *GatewayAddress) Port() uint16 {
	if g.HBONEPort == 0 {
		return DefaultHBONEPort
	}
	return g.HBONEPort
}

// NetworkIP is a single IP on a network.
type NetworkIP struct {
	Network string     `json:"network,omitempty"`
	IP      netip.Addr `json:"ip"`
}

// Service is one converted istio.workload.Service. Immutable once published.
type Service struct {
	// Key is "namespace/hostname", the xDS resource name.
	Key       string `json:"key"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Hostname  string `json:"hostname"`
	// VIPs are the service's addresses; empty for headless services.
	VIPs  []NetworkAddress `json:"vips,omitempty"`
	Ports []Port           `json:"ports,omitempty"`
	// SubjectAltNames are extra identities the service's endpoints may
	// present; entries that are not valid workload SPIFFE ids are dropped.
	SubjectAltNames []identity.Identity `json:"subjectAltNames,omitempty"`
	// Waypoint is the service's waypoint; nil means none.
	Waypoint *GatewayAddress `json:"waypoint,omitempty"`
	// WeightedWaypoints (canary waypoints), empty when unused.
	WeightedWaypoints []WeightedWaypoint `json:"weightedWaypoints,omitempty"`
	// LoadBalancing is nil when the service sets none (plain weighted random
	// over healthy endpoints).
	LoadBalancing      *LoadBalancing `json:"loadBalancing,omitempty"`
	IPFamilies         IPFamilies     `json:"ipFamilies"`
	Canonical          bool           `json:"canonical,omitempty"`
	IngressUseWaypoint bool           `json:"ingressUseWaypoint,omitempty"`
	Visibility         Visibility     `json:"visibility"`
	// ExportTo are the namespaces besides its own that may see a
	// VisibilityNamespace service (exportTo naming other namespaces), from
	// the extension ExportToExtension; nil for most services.
	ExportTo []string `json:"exportTo,omitempty"`
	// Extensions are kept raw (name, type URL, bytes) for consumers that know
	// them.
	Extensions []Extension `json:"extensions,omitempty"`
	// AliasOf is the target hostname of an ExternalName alias, from the
	// extension ExternalNameAliasExtension; "" when the service is no alias.
	AliasOf string `json:"aliasOf,omitempty"`
	// Global is set by the extension GlobalScopeExtension: the service is
	// exported to the other clusters of a multicluster mesh (Istio's
	// istio.io/global label or serviceScopeConfigs), so an east-west
	// gateway of its network may forward to it.
	Global bool `json:"global,omitempty"`
}

// GlobalScopeExtension is the Service extension our control plane uses to
// mark a service of global scope. It carries no config. Istio's workload API
// has no scope field (istiod scopes by what it sends, and configures its
// east-west gateways itself); a gateway that does not see the extension
// treats the service as cluster-local and refuses to forward to it, which
// fails closed.
const GlobalScopeExtension = "ztunnel-go.io/service-scope-global"

// ExportToExtension is the Service extension our control plane uses to
// widen a NAMESPACE-visible service to further namespaces (exportTo:
// [".", "team-b"]): its config is a google.protobuf.StringValue holding
// the namespaces, comma-separated. Istio's workload API has only PUBLIC
// and NAMESPACE; a node proxy that does not know the extension sees the
// narrower NAMESPACE, which fails closed.
const ExportToExtension = "ztunnel-go.io/export-to"

// VisibleTo reports whether clients in namespace ns may see s (resolve it
// by DNS, route to it as that service). ns "" (an unknown client) sees
// everything, as before visibility existed.
func (s *Service) VisibleTo(ns string) bool {
	if ns == "" || s.Visibility != VisibilityNamespace || s.Namespace == ns {
		return true
	}
	for _, n := range s.ExportTo {
		if n == ns {
			return true
		}
	}
	return false
}

// ExternalNameAliasExtension is the Service extension our control plane uses
// to mark an ExternalName alias; its config is a google.protobuf.StringValue
// holding the target hostname.
const ExternalNameAliasExtension = "ztunnel-go.io/external-name-alias"

// Port is one service port.
type Port struct {
	ServicePort uint16 `json:"servicePort"`
	// TargetPort 0 means a named port: the target comes from each endpoint's
	// Workload.Services entry.
	TargetPort  uint16      `json:"targetPort"`
	AppProtocol AppProtocol `json:"appProtocol"`
}

// TargetPort returns the service's target port for servicePort and whether
// the service declares servicePort at all.
func (s *Service) TargetPort(servicePort uint16) (uint16, bool) {
	for i := range s.Ports {
		if s.Ports[i].ServicePort == servicePort {
			return s.Ports[i].TargetPort, true
		}
	}
	return 0, false
}

// WeightedWaypoint is one canary waypoint choice.
type WeightedWaypoint struct {
	Destination GatewayAddress `json:"destination"`
	Weight      uint32         `json:"weight"`
}

// LoadBalancing is a service's endpoint selection policy.
type LoadBalancing struct {
	// RoutingPreference is matched in order against the source; ranks count
	// consecutive matches.
	RoutingPreference []LBScope      `json:"routingPreference,omitempty"`
	Mode              LBMode         `json:"mode"`
	HealthPolicy      LBHealthPolicy `json:"healthPolicy"`
}

// Extension is a raw extension kept from the wire.
type Extension struct {
	Name    string `json:"name"`
	TypeURL string `json:"typeUrl,omitempty"`
	Value   []byte `json:"value,omitempty"`
}

// Endpoint is a workload serving a service, with its ports for that service.
type Endpoint struct {
	Workload *Workload
	// Ports is Workload.PortsFor(service key), kept here to avoid the search.
	Ports []PortMapping
}
