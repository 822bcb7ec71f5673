package xds

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// errSink fails every call with err (no resource names) after recording it.
type errSink struct {
	err   error
	calls int
}

func (s *errSink) ApplyAddresses(map[string]*workloadapi.Address, []string) error {
	s.calls++
	return s.err
}

func (s *errSink) ApplyAuthorizations(map[string]*securityapi.Authorization, []string) error {
	s.calls++
	return s.err
}

func res(t testing.TB, name, version string, m proto.Message) *discovery.Resource {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return &discovery.Resource{Name: name, Version: version, Resource: a}
}

func rawRes(name, version, typeURL string, value []byte) *discovery.Resource {
	return &discovery.Resource{Name: name, Version: version, Resource: &anypb.Any{TypeUrl: typeURL, Value: value}}
}

func TestHandle(t *testing.T) {
	garbage := []byte{0xff, 0xff, 0xff} // an invalid varint tag
	tests := []struct {
		name      string
		held      map[string]string // address versions held before
		sink      Sink              // nil: a fakeSink
		resp      *discovery.DeltaDiscoveryResponse
		wantNACK  []string          // substrings of the NACK message; nil: ACK
		wantHeld  map[string]string // address versions after
		wantNames []string          // fakeSink addresses after (fakeSink only)
	}{
		{
			name: "upsert and remove",
			held: map[string]string{"r": "v0"},
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1",
				Resources:        []*discovery.Resource{res(t, "a", "v1", workload("a", "10.0.0.1"))},
				RemovedResources: []string{"r"}},
			wantHeld:  map[string]string{"a": "v1"},
			wantNames: []string{"a"},
		},
		{
			name: "undecodable resource keeps its old version, the rest applies",
			held: map[string]string{"x": "v0"},
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1", Resources: []*discovery.Resource{
				rawRes("x", "v1", AddressType, garbage),
				res(t, "a", "v1", workload("a", "10.0.0.1")),
			}},
			wantNACK:  []string{`"x": decode`},
			wantHeld:  map[string]string{"x": "v0", "a": "v1"},
			wantNames: []string{"a", "x"}, // x: the old copy stays
		},
		{
			name: "body of another type",
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1",
				Resources: []*discovery.Resource{res(t, "p", "v1", policy("ns", "p"))}},
			wantNACK: []string{`"p": resource type "type.googleapis.com/istio.security.Authorization" in a "type.googleapis.com/istio.workload.Address" response`},
			wantHeld: map[string]string{},
		},
		{
			name: "no name and no body",
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1", Resources: []*discovery.Resource{
				res(t, "", "v1", workload("a", "10.0.0.1")),
				{Name: "nobody", Version: "v1"},
			}},
			wantNACK: []string{`"": resource has no name`, `"nobody": resource has no body`},
			wantHeld: map[string]string{},
		},
		{
			name: "duplicate name with one undecodable copy",
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1", Resources: []*discovery.Resource{
				res(t, "a", "v1", workload("a", "10.0.0.1")),
				rawRes("a", "v2", AddressType, garbage),
			}},
			wantNACK: []string{`"a": decode`},
			wantHeld: map[string]string{},
		},
		{
			name: "sink rejects by name",
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1", Resources: []*discovery.Resource{
				res(t, "bad-1", "v1", workload("bad-1", "10.0.0.1")),
				res(t, "a", "v1", workload("a", "10.0.0.2")),
			}},
			wantNACK:  []string{`"bad-1": fake sink refuses bad names`},
			wantHeld:  map[string]string{"a": "v1"},
			wantNames: []string{"a"},
		},
		{
			name: "sink error without names withholds every version",
			held: map[string]string{"a": "v0", "r": "v0"},
			sink: &errSink{err: errors.New("boom")},
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1",
				Resources:        []*discovery.Resource{res(t, "a", "v1", workload("a", "10.0.0.1"))},
				RemovedResources: []string{"r"}},
			wantNACK: []string{"boom"},
			wantHeld: map[string]string{"a": "v0"},
		},
		{
			name: "unknown type URL",
			held: map[string]string{"a": "v0"},
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/istio.workload.Workload", Nonce: "n1",
				Resources: []*discovery.Resource{res(t, "a", "v1", workload("a", "10.0.0.1"))}},
			wantNACK: []string{`unknown type URL "type.googleapis.com/istio.workload.Workload"`},
			wantHeld: map[string]string{"a": "v0"},
		},
		{
			name:     "empty response",
			held:     map[string]string{"a": "v0"},
			resp:     &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1"},
			wantHeld: map[string]string{"a": "v0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeSink()
			sink := tt.sink
			if sink == nil {
				sink = fake
			}
			h := newHandler(sink)
			maps.Copy(h.versions[AddressType], tt.held)
			for n := range tt.held {
				fake.addrs[n] = workload(n, "10.9.9.9")
			}

			ack := handleProto(t, h, tt.resp)

			if ack.GetTypeUrl() != tt.resp.GetTypeUrl() || ack.GetResponseNonce() != tt.resp.GetNonce() {
				t.Errorf("ack {%q %q}, want {%q %q}", ack.GetTypeUrl(), ack.GetResponseNonce(), tt.resp.GetTypeUrl(), tt.resp.GetNonce())
			}
			msg := ack.GetErrorDetail().GetMessage()
			switch {
			case tt.wantNACK == nil && ack.GetErrorDetail() != nil:
				t.Errorf("NACK %q, want ACK", msg)
			case tt.wantNACK != nil && ack.GetErrorDetail() == nil:
				t.Errorf("ACK, want NACK with %q", tt.wantNACK)
			}
			for _, want := range tt.wantNACK {
				if !strings.Contains(msg, want) {
					t.Errorf("NACK message %q lacks %q", msg, want)
				}
			}
			if got := h.resourceVersions(AddressType); !maps.Equal(got, tt.wantHeld) {
				t.Errorf("versions = %v, want %v", got, tt.wantHeld)
			}
			if tt.wantNames != nil {
				if got := fake.names(AddressType); !slices.Equal(got, tt.wantNames) {
					t.Errorf("sink holds %v, want %v", got, tt.wantNames)
				}
			}
		})
	}
}

func TestHandleEmptyResponseSkipsSink(t *testing.T) {
	s := &errSink{err: errors.New("must not be called")}
	h := newHandler(s)
	ack := handleProto(t, h, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "1"})
	if ack.GetErrorDetail() != nil || s.calls != 0 {
		t.Errorf("empty response: NACK %v, sink calls %d; want ACK and no call", ack.GetErrorDetail(), s.calls)
	}
}

func TestSynced(t *testing.T) {
	tests := []struct {
		name  string
		types []string
		want  bool
	}{
		{name: "addresses only, twice", types: []string{AddressType, AddressType}},
		{name: "unknown type does not count", types: []string{AddressType, "type.googleapis.com/other"}},
		{name: "both", types: []string{AuthorizationType, AddressType}, want: true},
		{name: "both with NACKed content", types: []string{AddressType, AuthorizationType}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHandler(newFakeSink())
			for i, typ := range tt.types {
				resp := &discovery.DeltaDiscoveryResponse{TypeUrl: typ, Nonce: strconv.Itoa(i)}
				if strings.Contains(tt.name, "NACK") {
					resp.Resources = []*discovery.Resource{rawRes("x", "1", typ, []byte{0xff})}
				}
				handleProto(t, h, resp)
			}
			select {
			case <-h.synced:
				if !tt.want {
					t.Error("synced, want not")
				}
			default:
				if tt.want {
					t.Error("not synced")
				}
			}
		})
	}
}

func TestInitialRequestCarriesVersions(t *testing.T) {
	h := newHandler(newFakeSink())
	if r := h.initialRequest(AddressType); r.initialVersions != nil || r.typeURL != AddressType {
		t.Errorf("fresh initial request %+v", r)
	}
	handleProto(t, h, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "1",
		Resources: []*discovery.Resource{res(t, "a", "v1", workload("a", "10.0.0.1"))}})
	r := h.initialRequest(AddressType)
	if !maps.Equal(r.initialVersions, map[string]string{"a": "v1"}) || len(r.subscribe) != 0 {
		t.Errorf("initial request after a response = %+v", r)
	}
	// The request owns its map.
	r.initialVersions["a"] = "tampered"
	if h.resourceVersions(AddressType)["a"] != "v1" {
		t.Error("initial request shares the handler's version map")
	}
}

func TestResourceErrors(t *testing.T) {
	e := ResourceErrors{"b": errors.New("second"), "a": errors.New("first"), "c": nil}
	if got, want := e.Error(), `"a": first; "b": second; "c": rejected`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var named rejectedNamer
	if !errors.As(errorsWrap(e), &named) || !slices.Equal(named.RejectedNames(), []string{"a", "b", "c"}) {
		t.Error("a wrapped ResourceErrors is not found by errors.As")
	}
}

func errorsWrap(err error) error { return errors.Join(errors.New("state: apply"), err) }

func TestNodeInfo(t *testing.T) {
	n := NodeInfo{PodName: "zt-1", PodNamespace: "istio-system", NodeName: "n1",
		InstanceIPs: []string{"10.0.0.5", "fd00::5"},
		Metadata:    map[string]string{"NAME": "spoofed", "CLUSTER_ID": "c1"}}
	if got, want := n.ID(), "ztunnel~10.0.0.5~zt-1.istio-system~istio-system.svc.cluster.local"; got != want {
		t.Errorf("ID() = %q, want %q", got, want)
	}
	node := &core.Node{}
	if err := proto.Unmarshal(n.encode(), node); err != nil {
		t.Fatal(err)
	}
	if node.GetId() != n.ID() {
		t.Errorf("node id %q, want %q", node.GetId(), n.ID())
	}
	md := node.GetMetadata().GetFields()
	for k, want := range map[string]string{"NAME": "zt-1", "NAMESPACE": "istio-system", "INSTANCE_IPS": "10.0.0.5,fd00::5", "NODE_NAME": "n1", "CLUSTER_ID": "c1"} {
		if got := md[k].GetStringValue(); got != want {
			t.Errorf("metadata %s = %q, want %q", k, got, want)
		}
	}
}

// A large response (a full sync) is decoded on all CPUs; the outcome must be
// the same as the sequential path: every good resource applied with its
// version, every bad one named in the NACK and not recorded.
func TestHandleLargeResponseDecodesInParallel(t *testing.T) {
	const n = parallelDecodeMin + 1000
	resp := &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1"}
	for i := range n {
		name := "w" + strconv.Itoa(i)
		switch i {
		case 7, n - 1:
			resp.Resources = append(resp.Resources, rawRes(name, "v1", AddressType, []byte{0xff, 0xff, 0xff}))
		case 1500:
			resp.Resources = append(resp.Resources, rawRes(name, "v1", AuthorizationType, nil))
		default:
			resp.Resources = append(resp.Resources, res(t, name, "v"+strconv.Itoa(i),
				&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{Uid: name, Name: name}}}))
		}
	}
	sink := newFakeSink()
	h := newHandler(sink)
	ack := handleProto(t, h, resp)
	msg := ack.GetErrorDetail().GetMessage()
	for _, want := range []string{"w7", "w" + strconv.Itoa(n-1), "w1500"} {
		if !strings.Contains(msg, want) {
			t.Errorf("NACK %q does not name %s", msg, want)
		}
	}
	held := h.resourceVersions(AddressType)
	if len(sink.addrs) != n-3 || len(held) != n-3 {
		t.Fatalf("applied %d, versions held %d; want %d", len(sink.addrs), len(held), n-3)
	}
	if held["w42"] != "v42" || sink.addrs["w42"].GetWorkload().GetUid() != "w42" {
		t.Fatalf("w42: version %q, resource %v", held["w42"], sink.addrs["w42"])
	}
	if _, ok := held["w7"]; ok {
		t.Fatal("a rejected resource has a recorded version")
	}
}
