// Package statetest generates synthetic, realistic WDS resources (pods with
// IPs, localities, service memberships; services with VIPs and ports) at
// scale, for benchmarks and tests of internal/node/state and internal/xds (and the
// bench/xds program). It is deterministic: the same Config yields the same
// resources.
//
// It is not a fake control plane and has no state of its own.
package statetest

import (
	"fmt"
	"net/netip"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// Config sizes a synthetic mesh. Zero fields take the defaults noted.
type Config struct {
	Workloads  int // default 100_000
	Services   int // default 10_000; workload i is an endpoint of service i % Services
	Namespaces int // default 100
	Nodes      int // default 1_000
}

func (c Config) withDefaults() Config {
	if c.Workloads == 0 {
		c.Workloads = 100_000
	}
	if c.Services == 0 {
		c.Services = 10_000
	}
	if c.Namespaces == 0 {
		c.Namespaces = 100
	}
	if c.Nodes == 0 {
		c.Nodes = 1_000
	}
	return c
}

// ServiceName returns the resource name ("ns/hostname") of service j.
func ServiceName(c Config, j int) string {
	c = c.withDefaults()
	ns := fmt.Sprintf("ns-%d", j%c.Namespaces)
	return ns + "/" + fmt.Sprintf("svc-%d.%s.svc.cluster.local", j, ns)
}

// Service returns service j with one VIP in 10.96.0.0/12 and two ports (one
// named, target 0).
func Service(c Config, j int) *workloadapi.Address {
	c = c.withDefaults()
	ns := fmt.Sprintf("ns-%d", j%c.Namespaces)
	vip := netip.AddrFrom4([4]byte{10, 96 + byte(j>>16&0x0f), byte(j >> 8), byte(j)})
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name:      fmt.Sprintf("svc-%d", j),
		Namespace: ns,
		Hostname:  fmt.Sprintf("svc-%d.%s.svc.cluster.local", j, ns),
		Addresses: []*workloadapi.NetworkAddress{{Address: vip.AsSlice()}},
		Ports: []*workloadapi.Port{
			{ServicePort: 80, TargetPort: 8080, AppProtocol: workloadapi.AppProtocol_HTTP11},
			{ServicePort: 9090, TargetPort: 0},
		},
	}}}
}

// WorkloadUID returns the resource name of workload i.
func WorkloadUID(c Config, i int) string {
	c = c.withDefaults()
	j := i % c.Services
	return fmt.Sprintf("Kubernetes//Pod/ns-%d/svc-%d-%08x", j%c.Namespaces, j, uint32(i)*2654435761)
}

// Workload returns pod i (generation gen: a different gen changes its
// capacity, to model an update) on node i % Nodes, in the namespace of its
// service, with an IP in 10.128.0.0/9.
func Workload(c Config, i int, gen uint32) *workloadapi.Address {
	c = c.withDefaults()
	j := i % c.Services
	ns := fmt.Sprintf("ns-%d", j%c.Namespaces)
	ip := netip.AddrFrom4([4]byte{10, 128 + byte(i>>16&0x7f), byte(i >> 8), byte(i)})
	node := i % c.Nodes
	w := &workloadapi.Workload{
		Uid:               WorkloadUID(c, i),
		Name:              fmt.Sprintf("svc-%d-%08x", j, uint32(i)*2654435761),
		Namespace:         ns,
		Addresses:         [][]byte{ip.AsSlice()},
		TunnelProtocol:    workloadapi.TunnelProtocol_HBONE,
		ServiceAccount:    fmt.Sprintf("svc-%d", j),
		Node:              fmt.Sprintf("node-%d", node),
		CanonicalName:     fmt.Sprintf("svc-%d", j),
		CanonicalRevision: "v1",
		WorkloadType:      workloadapi.WorkloadType_POD,
		WorkloadName:      fmt.Sprintf("svc-%d", j),
		ClusterId:         "Kubernetes",
		Locality:          &workloadapi.Locality{Region: fmt.Sprintf("region-%d", node%3), Zone: fmt.Sprintf("zone-%d", node%9)},
		Services: map[string]*workloadapi.PortList{
			ServiceName(c, j): {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 9090, TargetPort: 9090}}},
		},
	}
	if gen != 0 {
		w.Capacity = wrapperspb.UInt32(gen + 1)
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// Mesh returns every resource of the synthetic mesh keyed by resource name,
// as a full WDS sync delivers them.
func Mesh(c Config) map[string]*workloadapi.Address {
	c = c.withDefaults()
	m := make(map[string]*workloadapi.Address, c.Workloads+c.Services)
	for j := 0; j < c.Services; j++ {
		m[ServiceName(c, j)] = Service(c, j)
	}
	for i := 0; i < c.Workloads; i++ {
		m[WorkloadUID(c, i)] = Workload(c, i, 0)
	}
	return m
}
