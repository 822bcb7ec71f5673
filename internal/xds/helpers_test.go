package xds

import (
	"errors"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// waitTimeout bounds every testkit.Eventually here: a generous deadline that
// only guards against hangs (no timing is asserted).
const waitTimeout = 15 * time.Second

// fakeSink is an in-memory Sink. It rejects resources named "bad*" with a
// ResourceErrors naming them and applies the rest.
type fakeSink struct {
	mu    sync.Mutex
	addrs map[string]*workloadapi.Address
	authz map[string]*securityapi.Authorization
	calls []sinkCall
}

type sinkCall struct {
	typeURL string
	upserts []string // sorted
	removes []string // sorted
}

func newFakeSink() *fakeSink {
	return &fakeSink{addrs: map[string]*workloadapi.Address{}, authz: map[string]*securityapi.Authorization{}}
}

func applyFake[M proto.Message](s *fakeSink, typeURL string, store map[string]M, upserts map[string]M, removes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	call := sinkCall{typeURL: typeURL, removes: slices.Sorted(slices.Values(removes))}
	bad := ResourceErrors{}
	for name, m := range upserts {
		call.upserts = append(call.upserts, name)
		if strings.HasPrefix(name, "bad") {
			bad[name] = errors.New("fake sink refuses bad names")
			continue
		}
		store[name] = m
	}
	sort.Strings(call.upserts)
	for _, n := range removes {
		delete(store, n)
	}
	s.calls = append(s.calls, call)
	if len(bad) > 0 {
		return bad
	}
	return nil
}

func (s *fakeSink) ApplyAddresses(upserts map[string]*workloadapi.Address, removes []string) error {
	return applyFake(s, AddressType, s.addrs, upserts, removes)
}

func (s *fakeSink) ApplyAuthorizations(upserts map[string]*securityapi.Authorization, removes []string) error {
	return applyFake(s, AuthorizationType, s.authz, upserts, removes)
}

// names returns the sorted names held for typeURL.
func (s *fakeSink) names(typeURL string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if typeURL == AddressType {
		for n := range s.addrs {
			out = append(out, n)
		}
	} else {
		for n := range s.authz {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func (s *fakeSink) address(name string) *workloadapi.Address {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[name]
}

func (s *fakeSink) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// callsSince returns the calls after the first n.
func (s *fakeSink) callsSince(n int) []sinkCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls[n:])
}

func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
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

func addrSet(m map[string]*workloadapi.Address) map[string]proto.Message {
	out := map[string]proto.Message{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func authzSet(m map[string]*securityapi.Authorization) map[string]proto.Message {
	out := map[string]proto.Message{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

var testNode = NodeInfo{PodName: "ztunnel-abc", PodNamespace: "istio-system", NodeName: "node-1", InstanceIPs: []string{"10.0.0.5"}}
