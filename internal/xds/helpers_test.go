package xds

import (
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// waitTimeout bounds every testkit.Eventually here: a generous deadline that
// only guards against hangs (no timing is asserted).
const waitTimeout = 15 * time.Second

// fakeSink is an in-memory Sink. It rejects resources named "bad*" with a
// ResourceErrors naming them and applies the rest. (The client-against-server
// tests in internal/controlplane/xdsserver have a recording variant: they
// cannot import this package's tests, nor this package its server.)
type fakeSink struct {
	mu    sync.Mutex
	addrs map[string]*workloadapi.Address
	authz map[string]*securityapi.Authorization
}

func newFakeSink() *fakeSink {
	return &fakeSink{addrs: map[string]*workloadapi.Address{}, authz: map[string]*securityapi.Authorization{}}
}

func applyFake[M proto.Message](s *fakeSink, store map[string]M, upserts map[string]M, removes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	bad := ResourceErrors{}
	for name, m := range upserts {
		if strings.HasPrefix(name, "bad") {
			bad[name] = errors.New("fake sink refuses bad names")
			continue
		}
		store[name] = m
	}
	for _, n := range removes {
		delete(store, n)
	}
	if len(bad) > 0 {
		return bad
	}
	return nil
}

func (s *fakeSink) ApplyAddresses(upserts map[string]*workloadapi.Address, removes []string) error {
	return applyFake(s, s.addrs, upserts, removes)
}

func (s *fakeSink) ApplyAuthorizations(upserts map[string]*securityapi.Authorization, removes []string) error {
	return applyFake(s, s.authz, upserts, removes)
}

// names returns the sorted names held for typeURL.
func (s *fakeSink) names(typeURL string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if typeURL == AddressType {
		return slices.Sorted(maps.Keys(s.addrs))
	}
	return slices.Sorted(maps.Keys(s.authz))
}

func workload(uid, ip string) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: uid, Name: uid, Namespace: "default", Addresses: [][]byte{net.ParseIP(ip).To4()},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
	}}}
}

func policy(ns, name string) *securityapi.Authorization {
	return &securityapi.Authorization{Name: name, Namespace: ns, Scope: securityapi.Scope_NAMESPACE}
}

var testNode = NodeInfo{PodName: "ztunnel-abc", PodNamespace: "istio-system", NodeName: "node-1", InstanceIPs: []string{"10.0.0.5"}}
