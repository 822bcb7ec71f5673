package xds

import (
	"bytes"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// The tests here hold wire.go to go-control-plane's generated types (which
// tests may link; the binaries do not): what the client encodes decodes
// with them to the message meant, and what they encode the client decodes
// to the same fields.

// toProto encodes r with the client's encoder and decodes it with the
// generated type.
func toProto(t testing.TB, r *deltaRequest) *discovery.DeltaDiscoveryRequest {
	t.Helper()
	m := &discovery.DeltaDiscoveryRequest{}
	if err := proto.Unmarshal(r.marshal(), m); err != nil {
		t.Fatalf("generated type rejects the client's request: %v", err)
	}
	return m
}

// fromProto encodes m with the generated type and decodes it with the
// client's decoder.
func fromProto(t testing.TB, m *discovery.DeltaDiscoveryResponse) *deltaResponse {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	r := &deltaResponse{}
	if err := r.unmarshal(b); err != nil {
		t.Fatalf("client rejects a generated response: %v", err)
	}
	return r
}

// handleProto runs the handler on a generated response and returns its
// reply as the generated request.
func handleProto(t testing.TB, h *handler, m *discovery.DeltaDiscoveryResponse) *discovery.DeltaDiscoveryRequest {
	t.Helper()
	return toProto(t, h.handle(fromProto(t, m)))
}

// want is what the client's decoder must make of m: the fields it reads,
// empty byte slices as nil.
func want(m *discovery.DeltaDiscoveryResponse) *deltaResponse {
	r := &deltaResponse{systemVersionInfo: m.GetSystemVersionInfo(), typeURL: m.GetTypeUrl(), nonce: m.GetNonce(),
		removed: m.GetRemovedResources()}
	for _, res := range m.GetResources() {
		body := res.GetResource()
		r.resources = append(r.resources, resource{name: res.GetName(), version: res.GetVersion(),
			hasBody: body != nil, bodyType: body.GetTypeUrl(), body: body.GetValue()})
	}
	return normal(r)
}

func normal(r *deltaResponse) *deltaResponse {
	c := *r
	c.size = 0
	if len(c.removed) == 0 {
		c.removed = nil
	}
	c.resources = nil
	for _, res := range r.resources {
		if len(res.body) == 0 {
			res.body = nil
		}
		c.resources = append(c.resources, res)
	}
	return &c
}

func TestWireRequestDecodesAsGenerated(t *testing.T) {
	node := NodeInfo{PodName: "zt-1", PodNamespace: "istio-system", InstanceIPs: []string{"10.0.0.5", "fd00::5"},
		Metadata: map[string]string{"CLUSTER_ID": "c1", "EMPTY": ""}}
	str := structpb.NewStringValue
	tests := []struct {
		name string
		req  *deltaRequest
		want *discovery.DeltaDiscoveryRequest
	}{
		{name: "empty", req: &deltaRequest{}, want: &discovery.DeltaDiscoveryRequest{}},
		{
			name: "first request of a stream",
			req: &deltaRequest{node: node.encode(), typeURL: AddressType,
				initialVersions: map[string]string{"a": "v1", "b": "", "": "v3", "ünï": "ü"}},
			want: &discovery.DeltaDiscoveryRequest{
				Node: &core.Node{Id: node.ID(), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
					"NAME": str("zt-1"), "NAMESPACE": str("istio-system"), "INSTANCE_IPS": str("10.0.0.5,fd00::5"),
					"NODE_NAME": str(""), "CLUSTER_ID": str("c1"), "EMPTY": str(""),
				}}},
				TypeUrl:                 AddressType,
				InitialResourceVersions: map[string]string{"a": "v1", "b": "", "": "v3", "ünï": "ü"},
			},
		},
		{
			name: "subscribe and unsubscribe names, empty ones kept",
			req:  &deltaRequest{typeURL: WaypointType, subscribe: []string{"ns/wp", ""}, unsubscribe: []string{"x"}},
			want: &discovery.DeltaDiscoveryRequest{TypeUrl: WaypointType,
				ResourceNamesSubscribe: []string{"ns/wp", ""}, ResourceNamesUnsubscribe: []string{"x"}},
		},
		{
			name: "ACK",
			req:  &deltaRequest{typeURL: AuthorizationType, responseNonce: "n7"},
			want: &discovery.DeltaDiscoveryRequest{TypeUrl: AuthorizationType, ResponseNonce: "n7"},
		},
		{
			name: "NACK",
			req: &deltaRequest{typeURL: AddressType, responseNonce: "n8",
				errorDetail: &rpcStatus{code: 3, message: `"x": decode: bad`}},
			want: &discovery.DeltaDiscoveryRequest{TypeUrl: AddressType, ResponseNonce: "n8",
				ErrorDetail: &rpcstatus.Status{Code: 3, Message: `"x": decode: bad`}},
		},
		{
			name: "NACK with a negative code and no message",
			req:  &deltaRequest{errorDetail: &rpcStatus{code: -2}},
			want: &discovery.DeltaDiscoveryRequest{ErrorDetail: &rpcstatus.Status{Code: -2}},
		},
		{
			name: "empty error detail is still a NACK",
			req:  &deltaRequest{errorDetail: &rpcStatus{}},
			want: &discovery.DeltaDiscoveryRequest{ErrorDetail: &rpcstatus.Status{}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := toProto(t, tt.req); !proto.Equal(got, tt.want) {
				t.Errorf("decoded as %v\nwant %v", got, tt.want)
			}
			// The encoder sizes its buffer exactly.
			if b := tt.req.marshal(); len(b) != cap(b) {
				t.Errorf("encoded %d bytes into a buffer of %d", len(b), cap(b))
			}
		})
	}
}

func TestWireNodeIsDeterministic(t *testing.T) {
	n := NodeInfo{PodName: "p", PodNamespace: "ns", InstanceIPs: []string{"10.0.0.1"},
		Metadata: map[string]string{"A": "1", "B": "2", "C": "3", "D": "4", "E": "5"}}
	first := n.encode()
	for range 20 {
		if !bytes.Equal(n.encode(), first) {
			t.Fatal("the node encodes differently from run to run")
		}
	}
}

func TestWireResponseFromGenerated(t *testing.T) {
	body := func(typeURL string, v []byte) *anypb.Any { return &anypb.Any{TypeUrl: typeURL, Value: v} }
	tests := []struct {
		name string
		resp *discovery.DeltaDiscoveryResponse
	}{
		{name: "empty", resp: &discovery.DeltaDiscoveryResponse{}},
		{
			name: "resources and removals",
			resp: &discovery.DeltaDiscoveryResponse{SystemVersionInfo: "sv", TypeUrl: AddressType, Nonce: "n1",
				Resources: []*discovery.Resource{
					{Name: "a", Version: "v1", Resource: body(AddressType, []byte{0x0a, 0x01, 0x61})},
					{Name: "b", Resource: body(AddressType, nil)}, // present, empty
					{Name: "c", Version: "v3"},                    // no body
					{},
				},
				RemovedResources: []string{"gone", "", "ünï"}},
		},
		{
			// Fields the client does not read are skipped, wherever they are.
			name: "fields the client does not read",
			resp: &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "n2",
				Resources: []*discovery.Resource{{
					Name: "ns/p", Version: "v1", Resource: body(AuthorizationType, []byte{0x0a, 0x01, 0x70}),
					Aliases: []string{"alias"}, Ttl: durationpb.New(30 * time.Second),
					CacheControl: &discovery.Resource_CacheControl{DoNotCache: true},
					Metadata:     &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"f": {}}},
					ResourceName: &discovery.ResourceName{Name: "ns/p"},
				}},
				ControlPlane:         &core.ControlPlane{Identifier: "istiod-1"},
				RemovedResourceNames: []*discovery.ResourceName{{Name: "old"}},
				ResourceErrors: []*discovery.ResourceError{{ResourceName: &discovery.ResourceName{Name: "e"},
					ErrorDetail: &rpcstatus.Status{Code: 5}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fromProto(t, tt.resp)
			if w := want(tt.resp); !reflect.DeepEqual(normal(got), w) {
				t.Errorf("decoded as %+v\nwant %+v", normal(got), w)
			}
			if n := proto.Size(tt.resp); got.size != n {
				t.Errorf("size = %d, want %d", got.size, n)
			}
		})
	}
}

// unknown appends one field of every wire type under num.
func unknown(b []byte, num protowire.Number) []byte {
	b = otherWireTypes(b, num)
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, []byte{0xff, 0xfe}) // not UTF-8: unknown bytes are opaque
}

// otherWireTypes appends one field of every wire type but bytes under num:
// under a known string or message field's number, they are unknown fields.
func otherWireTypes(b []byte, num protowire.Number) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	b = protowire.AppendVarint(b, 1<<40)
	b = protowire.AppendTag(b, num, protowire.Fixed32Type)
	b = protowire.AppendFixed32(b, 7)
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, 7)
	b = protowire.AppendTag(b, num, protowire.StartGroupType)
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, 5)
	return protowire.AppendTag(b, num, protowire.EndGroupType)
}

func bytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// TestWireUnknownFields decodes hand-made responses with unknown fields, a
// known number under another wire type, repeated singular fields and a body
// sent in two parts, and requires the generated type's reading of the same
// bytes.
func TestWireUnknownFields(t *testing.T) {
	anyA := bytesField(unknown(nil, 9), anyTypeURL, []byte(AddressType))
	anyB := unknown(bytesField(nil, anyValue, []byte{0x0a, 0x01, 0x61}), 3)
	anyB = otherWireTypes(anyB, anyTypeURL) // a known number, other wire types: unknown
	res := bytesField(nil, resName, []byte("first"))
	res = unknown(res, 99)
	res = bytesField(res, resResource, anyA)
	res = bytesField(res, resName, []byte("a")) // the last one wins
	res = bytesField(res, resResource, anyB)    // merged with anyA
	res = bytesField(res, resVersion, []byte("v1"))
	res = otherWireTypes(res, resName)

	var b []byte
	b = unknown(b, 3) // canary, a bool in DiscoveryResponse; unknown here
	b = bytesField(b, respNonce, []byte("n1"))
	b = bytesField(b, respResources, res)
	b = unknown(b, 1000)
	b = bytesField(b, respTypeURL, []byte(AddressType))
	b = otherWireTypes(b, respTypeURL)
	b = bytesField(b, respRemovedResources, []byte("r1"))
	b = bytesField(b, respResources, nil) // an empty Resource
	b = bytesField(b, respRemovedResources, []byte("r2"))
	b = unknown(b, protowire.MaxValidNumber)

	gen := &discovery.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(b, gen); err != nil {
		t.Fatalf("generated type rejects the test input: %v", err)
	}
	got := &deltaResponse{}
	if err := got.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if w := want(gen); !reflect.DeepEqual(normal(got), w) {
		t.Errorf("decoded as %+v\nthe generated type reads %+v", normal(got), w)
	}
	r := got.resources[0]
	if r.name != "a" || r.version != "v1" || r.bodyType != AddressType || !bytes.Equal(r.body, []byte{0x0a, 0x01, 0x61}) {
		t.Errorf("resource = %+v", r)
	}
	if len(got.resources) != 2 || len(got.removed) != 2 || got.size != len(b) {
		t.Errorf("%d resources, %d removed, size %d; want 2, 2, %d", len(got.resources), len(got.removed), got.size, len(b))
	}
}

// TestWireMalformed: input the generated type rejects too is an error naming
// the field, matched by errMalformed.
func TestWireMalformed(t *testing.T) {
	good := bytesField(nil, resName, []byte("a"))
	truncated := func(b []byte) []byte { return b[:len(b)-1] }
	tests := []struct {
		name  string
		input []byte
		want  string
	}{
		{"invalid tag", []byte{0xff, 0xff, 0xff}, "tag"},
		{"field number 0", protowire.AppendTag(nil, 0, protowire.VarintType), "tag"},
		{"truncated nonce", truncated(bytesField(nil, respNonce, []byte("n1"))), "nonce"},
		{"truncated unknown varint", append(protowire.AppendTag(nil, 8, protowire.VarintType), 0x80), "field 8"},
		{"unterminated group", protowire.AppendTag(nil, 12, protowire.StartGroupType), "field 12"},
		{"stray end group", protowire.AppendTag(nil, 12, protowire.EndGroupType), "field 12"},
		{"type URL not UTF-8", bytesField(nil, respTypeURL, []byte{0xc3, 0x28}), "type_url: malformed: invalid UTF-8"},
		{
			"removed name not UTF-8",
			bytesField(bytesField(nil, respRemovedResources, []byte("ok")), respRemovedResources, []byte{0xff}),
			"removed_resources[1]: malformed: invalid UTF-8",
		},
		{
			"resource name not UTF-8",
			bytesField(bytesField(nil, respResources, good), respResources, bytesField(nil, resName, []byte{0xff})),
			"resources[1].name: malformed: invalid UTF-8",
		},
		{
			"truncated resource version",
			bytesField(nil, respResources, truncated(bytesField(nil, resVersion, []byte("v1")))),
			"resources[0].version: malformed",
		},
		{
			"body type URL not UTF-8",
			bytesField(nil, respResources, bytesField(nil, resResource, bytesField(nil, anyTypeURL, []byte{0xff}))),
			"resources[0].resource.type_url: malformed: invalid UTF-8",
		},
		{
			"truncated body value",
			bytesField(nil, respResources, bytesField(nil, resResource, truncated(bytesField(nil, anyValue, []byte{1, 2})))),
			"resources[0].resource.value: malformed",
		},
		{"truncated resources", truncated(bytesField(nil, respResources, good)), "resources: malformed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if proto.Unmarshal(tt.input, &discovery.DeltaDiscoveryResponse{}) == nil {
				t.Fatal("the generated type accepts the test input")
			}
			err := (&deltaResponse{}).unmarshal(tt.input)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, errMalformed) || !strings.HasPrefix(err.Error(), "xds: decode DeltaDiscoveryResponse: ") ||
				!strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestWireCodec(t *testing.T) {
	c := codec{}
	if c.Name() != "proto" {
		t.Errorf("Name() = %q: the stream's content-type would not be application/grpc+proto", c.Name())
	}
	req := &deltaRequest{typeURL: AddressType, responseNonce: "n1"}
	bufs, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bufs.Materialize(), req.marshal()) {
		t.Error("Marshal differs from the request's encoding")
	}
	if _, err := c.Marshal(&discovery.DeltaDiscoveryRequest{}); err == nil {
		t.Error("Marshal accepted a message that is not a *deltaRequest")
	}

	gen := &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1",
		Resources: []*discovery.Resource{{Name: "a", Resource: &anypb.Any{TypeUrl: AddressType, Value: []byte{1, 2, 3}}}}}
	b, err := proto.Marshal(gen)
	if err != nil {
		t.Fatal(err)
	}
	// In two buffers, as gRPC may hand a message over; the body must not
	// alias them (gRPC reuses them once Unmarshal returns).
	split := mem.BufferSlice{mem.SliceBuffer(bytes.Clone(b[:5])), mem.SliceBuffer(bytes.Clone(b[5:]))}
	var resp deltaResponse
	if err := c.Unmarshal(split, &resp); err != nil {
		t.Fatal(err)
	}
	for _, buf := range split {
		clear(buf.ReadOnlyData())
	}
	if w := want(gen); !reflect.DeepEqual(normal(&resp), w) {
		t.Errorf("decoded as %+v, want %+v", normal(&resp), w)
	}
	if err := c.Unmarshal(split, &discovery.DeltaDiscoveryResponse{}); err == nil {
		t.Error("Unmarshal accepted a message that is not a *deltaResponse")
	}
}

// BenchmarkDecodeResponse decodes a 10,000-workload full sync with the
// client's decoder and with the generated type it replaced (which also
// copied every body out of gRPC's buffer).
func BenchmarkDecodeResponse(b *testing.B) {
	m := &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "1"}
	for i := range 10000 {
		name := "Kubernetes//Pod/default/w" + strconv.Itoa(i)
		a, err := anypb.New(workload(name, "10.1.0.1"))
		if err != nil {
			b.Fatal(err)
		}
		m.Resources = append(m.Resources, &discovery.Resource{Name: name, Version: strconv.Itoa(i), Resource: a})
	}
	data, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			var r deltaResponse
			if err := r.unmarshal(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("generated", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if err := proto.Unmarshal(data, &discovery.DeltaDiscoveryResponse{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
