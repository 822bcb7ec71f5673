package main

import (
	"fmt"
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// The scale objects: pods that exist only as objects (no namespace, no
// node), so each proxy's state holds as many workloads as a busy cluster's.
const (
	scaleNamespace = "bench-scale"
	scalePods      = 1000
	scaleServices  = 10
	// scaleNode is a node that does not exist: the node agents ignore the
	// pods (they reconcile only their own node's), the proxies hold them as
	// remote workloads.
	scaleNode = "bench-scale-node"
)

// scalePodIP is pod i's address: 10.31.100.10 onwards, the pod CIDRs of
// nodes the cluster does not have, so it never clashes with a real pod.
func scalePodIP(i int) netip.Addr {
	n := 100<<8 + 10 + i
	return netip.AddrFrom4([4]byte{10, 31, byte(n >> 8), byte(n)})
}

// applyScale writes the scale pods, services and endpoint slices into the
// control plane's config and returns the first and last pod IP (to wait
// for).
func (b *bench) applyScale() (first, last netip.Addr, err error) {
	hostIP := netip.MustParseAddr("10.30.0.250")
	objs := make([]kube.Object, 0, scalePods+2*scaleServices)
	slices := make([]*kube.EndpointSlice, scaleServices)
	for k := range scaleServices {
		name := fmt.Sprintf("scale-%d", k)
		objs = append(objs, &kube.Service{
			Meta:      kube.Meta{Name: name, Namespace: scaleNamespace, UID: fmt.Sprintf("bench-scale-svc-%d", k)},
			ClusterIP: netip.AddrFrom4([4]byte{10, 32, 200, byte(10 + k)}),
			Selector:  map[string]string{"app": name},
			Ports:     []kube.ServicePort{{Name: "http", Port: 80, TargetPort: 8080}},
		})
		slices[k] = &kube.EndpointSlice{
			Meta:        kube.Meta{Name: name + "-bench", Namespace: scaleNamespace, UID: fmt.Sprintf("bench-scale-es-%d", k)},
			ServiceName: name,
			Ports:       []kube.EndpointPort{{Name: "http", Port: 8080}},
		}
	}
	for i := range scalePods {
		k := i % scaleServices
		name := fmt.Sprintf("scale-%d-%d", k, i)
		ip := scalePodIP(i)
		objs = append(objs, &kube.Pod{
			Meta: kube.Meta{Name: name, Namespace: scaleNamespace, UID: fmt.Sprintf("bench-scale-pod-%d", i),
				Labels: map[string]string{"app": fmt.Sprintf("scale-%d", k)}},
			NodeName:   scaleNode,
			Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "http", Port: 8080}}}},
			Phase:      kube.PodRunning, Ready: true, HostIP: hostIP, IPs: []netip.Addr{ip},
		})
		slices[k].Endpoints = append(slices[k].Endpoints, kube.Endpoint{Address: ip, NodeName: scaleNode, Ready: true,
			TargetRef: kube.Ref{Kind: "Pod", Namespace: scaleNamespace, Name: name, UID: fmt.Sprintf("bench-scale-pod-%d", i)}})
	}
	for _, es := range slices {
		objs = append(objs, es)
	}
	data, err := kube.Marshal(objs...)
	if err != nil {
		return first, last, err
	}
	if err := b.m.Apply("bench-scale", data); err != nil {
		return first, last, err
	}
	return scalePodIP(0), scalePodIP(scalePods - 1), nil
}
