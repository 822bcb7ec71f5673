package xdsserver

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// decodeWire marshals r's fast path with the registered codec and decodes
// the bytes as gRPC's client would.
func decodeWire(t *testing.T, r *response) *discovery.DeltaDiscoveryResponse {
	t.Helper()
	bufs, err := registeredCodec.Marshal(r.wire())
	if err != nil {
		t.Fatal(err)
	}
	got := &discovery.DeltaDiscoveryResponse{}
	if err := proto.Unmarshal(bufs.Materialize(), got); err != nil {
		t.Fatalf("fast-path bytes do not decode: %v", err)
	}
	return got
}

func TestWireEntryDecodes(t *testing.T) {
	long := strings.Repeat("x", 300) // lengths past one varint byte
	tests := []struct {
		name, typeURL, resName, version string
		value                           []byte
	}{
		{name: "workload", typeURL: xds.AddressType, resName: "Kubernetes//Pod/ns/a", version: strings.Repeat("ab", 32), value: []byte{1, 2, 3}},
		{name: "empty value (an empty message)", typeURL: xds.AddressType, resName: "a", version: "v"},
		{name: "empty name", typeURL: xds.AuthorizationType, version: "v", value: []byte("p")},
		{name: "long fields", typeURL: xds.AddressType, resName: long, version: long, value: []byte(long + long)},
		{name: "non-ASCII name", typeURL: xds.AddressType, resName: "ns/ünï", version: "v", value: []byte{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEntry(tt.typeURL, tt.resName, tt.version, tt.value)
			want := &discovery.Resource{Name: tt.resName, Version: tt.version, Resource: &anypb.Any{TypeUrl: tt.typeURL, Value: tt.value}}
			if !proto.Equal(e.res, want) {
				t.Errorf("entry message = %v, want %v", e.res, want)
			}
			// The stored bytes are one resources field of a response.
			got := &discovery.DeltaDiscoveryResponse{}
			if err := proto.Unmarshal(e.wire.ReadOnlyData(), got); err != nil {
				t.Fatal(err)
			}
			if len(got.Resources) != 1 || !proto.Equal(got.Resources[0], want) {
				t.Errorf("entry bytes decode to %v, want one %v", got, want)
			}
		})
	}
}

func TestWireResponseDecodes(t *testing.T) {
	// Entries as the server builds them, from real resources.
	s := NewServer(ServerConfig{})
	set := map[string]*workloadapi.Address{}
	for i := range 300 {
		uid := fmt.Sprintf("Kubernetes//Pod/default/w-%d", i)
		set[uid] = workload(uid, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
	}
	s.SetResources(xds.AddressType, addrSet(set))
	snap := s.types[xds.AddressType].load()
	var all []*entry
	for _, e := range snap.All() {
		all = append(all, e)
	}
	one, _ := snap.Get("Kubernetes//Pod/default/w-7")

	tests := []struct {
		name string
		resp response
	}{
		{name: "full sync", resp: response{typeURL: xds.AddressType, nonce: "1", resources: all}},
		{name: "incremental with removals", resp: response{typeURL: xds.AddressType, nonce: "42", resources: []*entry{one}, removed: []string{"gone-1", "gone-2"}}},
		{name: "removals only", resp: response{typeURL: xds.AuthorizationType, nonce: "7", removed: []string{"ns/p"}}},
		{name: "empty first answer", resp: response{typeURL: xds.AuthorizationType, nonce: "2"}},
		{name: "system version info", resp: response{systemVersion: "2026-12-02/17", typeURL: xds.AddressType, nonce: "3", resources: all[:5]}},
		{name: "an empty removed name is kept", resp: response{typeURL: xds.AddressType, nonce: "9", removed: []string{"", "x"}}},
		{name: "no nonce, no type", resp: response{resources: []*entry{one}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.resp.message()
			got := decodeWire(t, &tt.resp)
			if !proto.Equal(got, want) {
				t.Errorf("fast path decodes to a different response:\n got %v\nwant %v", got, want)
			}
			// The slow path through the same codec (delegated to gRPC's
			// proto codec) gives the same message.
			bufs, err := registeredCodec.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			slow := &discovery.DeltaDiscoveryResponse{}
			if err := registeredCodec.Unmarshal(bufs, slow); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(slow, got) {
				t.Errorf("slow path %v != fast path %v", slow, got)
			}
		})
	}
}

func TestWireCodecRegistered(t *testing.T) {
	if !wireCodecActive() {
		t.Fatal(`gRPC's "proto" codec is not the xds package's: responses would be marshalled`)
	}
	// Every other message goes through gRPC's own proto codec.
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResponseNonce: "5", ResourceNamesSubscribe: []string{"a"}}
	bufs, err := registeredCodec.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	got := &discovery.DeltaDiscoveryRequest{}
	if err := registeredCodec.Unmarshal(bufs, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, req) {
		t.Errorf("round trip = %v, want %v", got, req)
	}
	if _, err := registeredCodec.Marshal(struct{}{}); err == nil {
		t.Error("a non-message marshalled without error")
	}
}

// TestWireOverStream checks what a raw ADS client receives from a real
// server: the full response of a resumed subscription and an incremental one
// with a removal decode to the entries' resources.
func TestWireOverStream(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	set := map[string]*workloadapi.Address{}
	for i := range 50 {
		uid := fmt.Sprintf("w-%d", i)
		set[uid] = workload(uid, fmt.Sprintf("10.1.0.%d", i+1))
	}
	srv.SetResources(xds.AddressType, addrSet(set))
	srv.SetResources(xds.AuthorizationType, nil)

	wantResources := func(names ...string) []*discovery.Resource {
		snap := srv.types[xds.AddressType].load()
		var out []*discovery.Resource
		for _, n := range names {
			e, ok := snap.Get(n)
			if !ok {
				t.Fatalf("%s not served", n)
			}
			out = append(out, e.res)
		}
		return out
	}
	byName := func(rs []*discovery.Resource) []*discovery.Resource {
		rs = slices.Clone(rs)
		slices.SortFunc(rs, func(a, b *discovery.Resource) int { return strings.Compare(a.GetName(), b.GetName()) })
		return rs
	}

	r := dialRaw(t, srv.addr)
	// Resuming: one name the server no longer has, one held at an old
	// version (sent once), one held at the current version (not sent).
	r.send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, InitialResourceVersions: map[string]string{
		"stale": "v0", "w-0": "old", "w-1": srv.Versions(xds.AddressType)["w-1"]}})
	full, names := r.recv()
	want := &discovery.DeltaDiscoveryResponse{TypeUrl: xds.AddressType, Nonce: full.GetNonce(),
		Resources: wantResources(names...), RemovedResources: []string{"stale"}}
	if full.GetNonce() == "" || len(names) != 49 || slices.Contains(names, "w-1") || !slices.Contains(names, "w-0") {
		t.Fatalf("full response: nonce %q, %d resources (want 49: all but w-1, w-0 once): %v", full.GetNonce(), len(names), names)
	}
	full.Resources = byName(full.Resources)
	if !proto.Equal(full, want) {
		t.Errorf("full response:\n got %v\nwant %v", full, want)
	}

	delete(set, "w-3")
	set["w-4"] = workload("w-4", "10.1.1.4")
	srv.SetResources(xds.AddressType, addrSet(set))
	inc, names := r.recv()
	want = &discovery.DeltaDiscoveryResponse{TypeUrl: xds.AddressType, Nonce: inc.GetNonce(),
		Resources: wantResources(names...), RemovedResources: []string{"w-3"}}
	if !slices.Equal(names, []string{"w-4"}) || inc.GetNonce() == full.GetNonce() {
		t.Fatalf("incremental response: nonce %q, resources %v", inc.GetNonce(), names)
	}
	if !proto.Equal(inc, want) {
		t.Errorf("incremental response:\n got %v\nwant %v", inc, want)
	}
}
