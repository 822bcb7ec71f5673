package workloadapi

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/apitest"
)

// contract is the wire contract with Istio: every field number and enum value
// of the istio.workload package. Changing a number here breaks compatibility
// with istiod.
var contract = apitest.Contract{
	Package: "istio.workload",
	Messages: map[string]map[string]protoreflect.FieldNumber{
		"Address": {"workload": 1, "service": 2},
		"Service": {
			"name": 1, "namespace": 2, "hostname": 3, "addresses": 4, "ports": 5,
			"subject_alt_names": 6, "waypoint": 7, "load_balancing": 8, "ip_families": 9,
			"extensions": 10, "canonical": 11, "ingress_use_waypoint": 12,
			"weighted_waypoints": 13, "visibility": 14,
		},
		"WeightedWaypoint": {"destination": 1, "weight": 2},
		"LoadBalancing": {
			"routing_preference": 1, "mode": 2, "health_policy": 3, "dns_connect_strategy": 4,
		},
		"Workload": {
			"uid": 20, "name": 1, "namespace": 2, "addresses": 3, "hostname": 21, "network": 4,
			"tunnel_protocol": 5, "trust_domain": 6, "service_account": 7, "waypoint": 8,
			"network_gateway": 19, "node": 9, "canonical_name": 10, "canonical_revision": 11,
			"workload_type": 12, "workload_name": 13, "native_tunnel": 14, "application_tunnel": 23,
			"services": 22, "authorization_policies": 16, "status": 17, "cluster_id": 18,
			"locality": 24, "network_mode": 25, "extensions": 26, "capacity": 27,
		},
		"Locality":           {"region": 1, "zone": 2, "subzone": 3},
		"PortList":           {"ports": 1},
		"Port":               {"service_port": 1, "target_port": 2, "app_protocol": 3},
		"ApplicationTunnel":  {"protocol": 1, "port": 2},
		"GatewayAddress":     {"hostname": 1, "address": 2, "hbone_mtls_port": 3},
		"NetworkAddress":     {"network": 1, "address": 2, "length": 3},
		"NamespacedHostname": {"namespace": 1, "hostname": 2},
		"Extension":          {"name": 1, "config": 2},
	},
	Enums: map[string]map[string]protoreflect.EnumNumber{
		"IPFamilies":         {"AUTOMATIC": 0, "IPV4_ONLY": 1, "IPV6_ONLY": 2, "DUAL": 3},
		"NetworkMode":        {"STANDARD": 0, "HOST_NETWORK": 1},
		"WorkloadStatus":     {"HEALTHY": 0, "UNHEALTHY": 1},
		"WorkloadType":       {"DEPLOYMENT": 0, "CRONJOB": 1, "POD": 2, "JOB": 3},
		"AppProtocol":        {"UNKNOWN": 0, "HTTP11": 1, "HTTP2": 2, "GRPC": 3, "TCP": 4, "TLS": 5},
		"TunnelProtocol":     {"NONE": 0, "HBONE": 1, "LEGACY_ISTIO_MTLS": 2},
		"Service.Visibility": {"PUBLIC": 0, "NAMESPACE": 1},
		"LoadBalancing.Scope": {
			"UNSPECIFIED_SCOPE": 0, "REGION": 1, "ZONE": 2, "SUBZONE": 3, "NODE": 4, "CLUSTER": 5, "NETWORK": 6,
		},
		"LoadBalancing.Mode":               {"UNSPECIFIED_MODE": 0, "STRICT": 1, "FAILOVER": 2, "PASSTHROUGH": 3},
		"LoadBalancing.HealthPolicy":       {"ONLY_HEALTHY": 0, "ALLOW_ALL": 1},
		"LoadBalancing.DnsConnectStrategy": {"DEFAULT": 0, "FIRST_HEALTHY_RACE": 1},
		"ApplicationTunnel.Protocol":       {"NONE": 0, "PROXY": 1},
	},
}

func TestWireContract(t *testing.T) {
	fd := File_workloadapi_workload_proto
	apitest.CheckContract(t, fd, contract)
	w := apitest.Find(fd, "Workload").(protoreflect.MessageDescriptor)
	if r := w.ReservedRanges(); r.Len() != 1 || !r.Has(15) {
		t.Errorf("Workload must reserve exactly field 15")
	}
	na := apitest.Find(fd, "NetworkAddress").(protoreflect.MessageDescriptor)
	if !na.Fields().ByName("length").HasPresence() {
		t.Errorf("NetworkAddress.length must be optional (explicit presence)")
	}
}

func fullWorkload() *Workload {
	ext, err := anypb.New(wrapperspb.String("x"))
	if err != nil {
		panic(err)
	}
	return &Workload{
		Uid:            "Kubernetes//Pod/default/app-1",
		Name:           "app-1",
		Namespace:      "default",
		Addresses:      [][]byte{{10, 0, 0, 1}},
		Hostname:       "app-1.example",
		Network:        "net1",
		TunnelProtocol: TunnelProtocol_HBONE,
		TrustDomain:    "example.org",
		ServiceAccount: "app",
		Waypoint: &GatewayAddress{
			Destination: &GatewayAddress_Hostname{Hostname: &NamespacedHostname{
				Namespace: "istio-system", Hostname: "wp.istio-system.svc.cluster.local",
			}},
			HboneMtlsPort: 15008,
		},
		NetworkGateway: &GatewayAddress{
			Destination:   &GatewayAddress_Address{Address: &NetworkAddress{Network: "net1", Address: []byte{10, 9, 9, 9}}},
			HboneMtlsPort: 15008,
		},
		Node:              "node-a",
		CanonicalName:     "app",
		CanonicalRevision: "v1",
		WorkloadType:      WorkloadType_POD,
		WorkloadName:      "app",
		NativeTunnel:      true,
		ApplicationTunnel: &ApplicationTunnel{Protocol: ApplicationTunnel_PROXY, Port: 15088},
		Services: map[string]*PortList{
			"default/app.default.svc.cluster.local": {Ports: []*Port{{ServicePort: 80, TargetPort: 8080, AppProtocol: AppProtocol_HTTP2}}},
		},
		AuthorizationPolicies: []string{"default/allow-app"},
		Status:                WorkloadStatus_UNHEALTHY,
		ClusterId:             "Kubernetes",
		Locality:              &Locality{Region: "r", Zone: "z", Subzone: "s"},
		NetworkMode:           NetworkMode_HOST_NETWORK,
		Extensions:            []*Extension{{Name: "e", Config: ext}},
		Capacity:              wrapperspb.UInt32(3),
	}
}

func fullService() *Service {
	wp := &GatewayAddress{
		Destination:   &GatewayAddress_Address{Address: &NetworkAddress{Address: []byte{10, 1, 1, 1}}},
		HboneMtlsPort: 15008,
	}
	return &Service{
		Name:            "app",
		Namespace:       "default",
		Hostname:        "app.default.svc.cluster.local",
		Addresses:       []*NetworkAddress{{Network: "net1", Address: []byte{10, 96, 0, 0}, Length: proto.Uint32(16)}},
		Ports:           []*Port{{ServicePort: 80, AppProtocol: AppProtocol_TLS}},
		SubjectAltNames: []string{"spiffe://example.org/ns/default/sa/app"},
		Waypoint:        wp,
		LoadBalancing: &LoadBalancing{
			RoutingPreference:  []LoadBalancing_Scope{LoadBalancing_NETWORK, LoadBalancing_ZONE},
			Mode:               LoadBalancing_FAILOVER,
			HealthPolicy:       LoadBalancing_ALLOW_ALL,
			DnsConnectStrategy: LoadBalancing_FIRST_HEALTHY_RACE,
		},
		IpFamilies:         IPFamilies_DUAL,
		Extensions:         []*Extension{{Name: "e"}},
		Canonical:          true,
		IngressUseWaypoint: true,
		WeightedWaypoints:  []*WeightedWaypoint{{Destination: wp, Weight: 90}},
		Visibility:         Service_NAMESPACE,
	}
}

func TestRoundTrip(t *testing.T) {
	apitest.CheckPopulated(t, fullWorkload())
	apitest.CheckPopulated(t, fullService())
	apitest.RoundTrip(t, &Address{Type: &Address_Workload{Workload: fullWorkload()}})
	apitest.RoundTrip(t, &Address{Type: &Address_Service{Service: fullService()}})
}

func TestWireNumbers(t *testing.T) {
	// uid is field 20 (not 1); services (a map) and capacity (a wrapper) are
	// length-delimited.
	wb := apitest.RoundTrip(t, fullWorkload())
	apitest.WantOnWire(t, wb, map[protowire.Number]protowire.Type{
		20: protowire.BytesType, 1: protowire.BytesType, 3: protowire.BytesType,
		5: protowire.VarintType, 14: protowire.VarintType, 22: protowire.BytesType,
		27: protowire.BytesType,
	})

	ab := apitest.RoundTrip(t, &Address{Type: &Address_Service{Service: &Service{Name: "s"}}})
	apitest.WantOnWire(t, ab, map[protowire.Number]protowire.Type{2: protowire.BytesType})
	if _, ok := apitest.WireFields(t, ab)[1]; ok {
		t.Error("Address.service must not be encoded as field 1")
	}

	// An explicitly set zero CIDR length is still sent (optional field).
	nb := apitest.RoundTrip(t, &NetworkAddress{Length: proto.Uint32(0)})
	apitest.WantOnWire(t, nb, map[protowire.Number]protowire.Type{3: protowire.VarintType})
}
