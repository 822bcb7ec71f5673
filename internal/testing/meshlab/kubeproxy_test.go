package meshlab

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

func TestKubeProxyRules(t *testing.T) {
	svc := func(name, ip string, port int) *kube.Service {
		return &kube.Service{Meta: kube.Meta{Name: name, Namespace: "ns"}, ClusterIP: netip.MustParseAddr(ip),
			Ports: []kube.ServicePort{{Name: "tcp", Port: port}, {Name: "dns", Port: 53, Protocol: "UDP"}}}
	}
	slice := func(name string, ready bool, ips ...string) *kube.EndpointSlice {
		es := &kube.EndpointSlice{Meta: kube.Meta{Name: name + "-x", Namespace: "ns"}, ServiceName: name,
			Ports: []kube.EndpointPort{{Name: "tcp", Port: 8080}, {Name: "dns", Port: 53, Protocol: "UDP"}}}
		for _, ip := range ips {
			es.Endpoints = append(es.Endpoints, kube.Endpoint{Address: netip.MustParseAddr(ip), Ready: ready})
		}
		return es
	}
	for _, tc := range []struct {
		name string
		objs []kube.Object
		want []string // rule lines between the chain declaration and COMMIT
	}{
		{"no services", nil, nil},
		{"one endpoint", []kube.Object{svc("a", "10.32.0.10", 80), slice("a", true, "10.31.0.10")},
			[]string{"-A MESHLAB-SERVICES -d 10.32.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.31.0.10:8080"}},
		{"two endpoints share the traffic", []kube.Object{svc("a", "10.32.0.10", 80), slice("a", true, "10.31.0.10", "10.31.1.10")},
			[]string{
				"-A MESHLAB-SERVICES -d 10.32.0.10/32 -p tcp --dport 80 -m statistic --mode random --probability 0.50000 -j DNAT --to-destination 10.31.0.10:8080",
				"-A MESHLAB-SERVICES -d 10.32.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.31.1.10:8080",
			}},
		{"not ready endpoints get no traffic", []kube.Object{svc("a", "10.32.0.10", 80), slice("a", false, "10.31.0.10")}, nil},
		{"a service without endpoint slice", []kube.Object{svc("a", "10.32.0.10", 80)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := KubeProxyRules(tc.objs)
			want := "*nat\n:MESHLAB-SERVICES - [0:0]\n"
			if len(tc.want) > 0 {
				want += strings.Join(tc.want, "\n") + "\n"
			}
			want += "COMMIT\n"
			if got != want {
				t.Errorf("rules:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
