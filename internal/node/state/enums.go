package state

// Closed enums converted from the wire; each has the wire's numbering and
// String/MarshalText for logs and the admin dump.

// TunnelProtocol is how a workload is reached.
type TunnelProtocol uint8

const (
	TunnelNone  TunnelProtocol = iota // plain TCP
	TunnelHBONE                       // HTTP/2 CONNECT over mTLS to port 15008
)

func (v TunnelProtocol) String() string {
	names := [...]string{"NONE", "HBONE"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v TunnelProtocol) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// WorkloadType is the kind of controller behind a workload.
type WorkloadType uint8

const (
	WorkloadDeployment WorkloadType = iota
	WorkloadCronJob
	WorkloadPod
	WorkloadJob
)

func (v WorkloadType) String() string {
	names := [...]string{"DEPLOYMENT", "CRONJOB", "POD", "JOB"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v WorkloadType) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// AppTunnelProtocol is how a sandwiched workload accepts tunnelled traffic.
type AppTunnelProtocol uint8

const (
	AppTunnelNone  AppTunnelProtocol = iota // raw TCP
	AppTunnelProxy                          // PROXY protocol v2
)

func (v AppTunnelProtocol) String() string {
	names := [...]string{"NONE", "PROXY"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v AppTunnelProtocol) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// AppProtocol is a service port's declared application protocol.
type AppProtocol uint8

const (
	AppProtocolUnknown AppProtocol = iota
	AppProtocolHTTP11
	AppProtocolHTTP2
	AppProtocolGRPC
	AppProtocolTCP
	AppProtocolTLS
)

func (v AppProtocol) String() string {
	names := [...]string{"UNKNOWN", "HTTP11", "HTTP2", "GRPC", "TCP", "TLS"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v AppProtocol) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// IPFamilies is which address families a service serves.
type IPFamilies uint8

const (
	IPFamiliesAutomatic IPFamilies = iota
	IPFamiliesIPv4Only
	IPFamiliesIPv6Only
	IPFamiliesDual
)

func (v IPFamilies) String() string {
	names := [...]string{"AUTOMATIC", "IPV4_ONLY", "IPV6_ONLY", "DUAL"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v IPFamilies) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// Visibility is who may resolve a service.
type Visibility uint8

const (
	VisibilityPublic    Visibility = iota
	VisibilityNamespace            // only its own namespace
)

func (v Visibility) String() string {
	names := [...]string{"PUBLIC", "NAMESPACE"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v Visibility) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// LBScope is one routing preference, compared between source and endpoint.
type LBScope uint8

const (
	ScopeUnspecified LBScope = iota // never sent; rejected
	ScopeRegion
	ScopeZone
	ScopeSubzone
	ScopeNode
	ScopeCluster
	ScopeNetwork
)

func (v LBScope) String() string {
	names := [...]string{"UNSPECIFIED", "REGION", "ZONE", "SUBZONE", "NODE", "CLUSTER", "NETWORK"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v LBScope) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// LBMode is how routing preferences are applied.
type LBMode uint8

const (
	LBModeUnspecified LBMode = iota // no ranking: weighted random over all eligible endpoints
	LBModeStrict                    // only endpoints matching every preference
	LBModeFailover                  // the best-ranked endpoints
	LBModePassthrough               // the original destination is used; no ranking
)

func (v LBMode) String() string {
	names := [...]string{"UNSPECIFIED", "STRICT", "FAILOVER", "PASSTHROUGH"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v LBMode) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// LBHealthPolicy is which endpoints are eligible by health.
type LBHealthPolicy uint8

const (
	OnlyHealthy LBHealthPolicy = iota
	AllowAll                   // unhealthy endpoints too
)

func (v LBHealthPolicy) String() string {
	names := [...]string{"ONLY_HEALTHY", "ALLOW_ALL"}
	if int(v) < len(names) {
		return names[v]
	}
	return "UNKNOWN"
}

// MarshalText prints the wire name.
func (v LBHealthPolicy) MarshalText() ([]byte, error) { return []byte(v.String()), nil }
