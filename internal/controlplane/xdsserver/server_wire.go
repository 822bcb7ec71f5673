package xdsserver

import (
	"fmt"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
)

// Pre-encoded responses. A DeltaDiscoveryResponse of a full sync carries
// every resource of the type (110,000 at 100k workloads); marshalling it with
// proto.Marshal sizes and copies every Resource and its Any again for every
// stream (0.5 CPU-s per full sync). Instead each entry keeps its Resource
// already encoded as the response's field-2 entry (tag, length, bytes), made
// once when the resource changes, and a response is written as the
// concatenation of those entries and a few encoded fields around them:
// protobuf allows a message's fields in any order and repeated fields as
// separate entries, so the bytes decode to exactly the DeltaDiscoveryResponse
// the server would otherwise have marshalled (TestWireResponseDecodes
// checks it field by field with proto.Equal).
//
// gRPC v1.85's proto codec marshals only proto.Message values, so the xds
// package registers, at init, a CodecV2 under the codec name "proto" that
// writes a *wireResponse from its bytes (no copy: the entries are handed to
// the transport as read-only buffers) and passes every other message to the
// codec it replaces. It is the codec of every gRPC client and server of the
// process with the default content subtype; a server built with
// grpc.ForceServerCodec(V2) must not serve this package's streams. When the
// registered "proto" codec is not ours (some other package registered one
// after us) the server falls back to sending the DeltaDiscoveryResponse.

// DeltaDiscoveryResponse field numbers (envoy/service/discovery/v3/discovery.proto).
const (
	respSystemVersionInfo = 1
	respResources         = 2
	respTypeURL           = 4
	respNonce             = 5
	respRemovedResources  = 6
)

// Resource and Any field numbers.
const (
	resVersion  = 1
	resResource = 2
	resName     = 3
	anyTypeURL  = 1
	anyValue    = 2
)

// newEntry encodes one resource as a DeltaDiscoveryResponse.resources entry:
// Resource{name, version, resource: Any{typeURL, value}}, fields in number
// order as proto.Marshal writes them, empty strings omitted as proto3 does.
// The entry's Resource message shares the value bytes with the encoding.
func newEntry(typeURL, name, version string, value []byte) *entry {
	anyLen := sizeString(anyTypeURL, typeURL) + sizeBytes(anyValue, value)
	resLen := sizeString(resVersion, version) +
		protowire.SizeTag(resResource) + protowire.SizeBytes(anyLen) +
		sizeString(resName, name)
	b := make([]byte, 0, protowire.SizeTag(respResources)+protowire.SizeBytes(resLen))
	b = protowire.AppendTag(b, respResources, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(resLen))
	b = appendString(b, resVersion, version)
	b = protowire.AppendTag(b, resResource, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(anyLen))
	b = appendString(b, anyTypeURL, typeURL)
	var v []byte // aliases b, so the Any and the encoding share one copy
	if len(value) > 0 {
		b = protowire.AppendTag(b, anyValue, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(len(value)))
		off := len(b)
		b = append(b, value...)
		v = b[off:len(b):len(b)]
	}
	b = appendString(b, resName, name)
	return &entry{
		version: version,
		wire:    mem.SliceBuffer(b), // boxed once here, not per response
		res:     &discovery.Resource{Name: name, Version: version, Resource: &anypb.Any{TypeUrl: typeURL, Value: v}},
	}
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func sizeBytes(num protowire.Number, b []byte) int {
	if len(b) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(b))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

// response is one DeltaDiscoveryResponse about to be sent, in a form that
// can be either encoded from the entries' bytes (wire) or built as the
// message (message).
type response struct {
	systemVersion string // not set by the server today; encoded when set
	typeURL       string
	nonce         string
	resources     []*entry
	removed       []string
}

// message is the DeltaDiscoveryResponse the response stands for.
func (r *response) message() *discovery.DeltaDiscoveryResponse {
	m := &discovery.DeltaDiscoveryResponse{
		SystemVersionInfo: r.systemVersion,
		TypeUrl:           r.typeURL,
		Nonce:             r.nonce,
		RemovedResources:  r.removed,
	}
	if len(r.resources) > 0 {
		m.Resources = make([]*discovery.Resource, len(r.resources))
		for i, e := range r.resources {
			m.Resources[i] = e.res
		}
	}
	return m
}

// wire encodes the response: the system version, then every resource entry
// as it is stored, then type URL, nonce and removed names.
func (r *response) wire() *wireResponse {
	var head, tail []byte
	head = appendString(head, respSystemVersionInfo, r.systemVersion)
	tail = appendString(tail, respTypeURL, r.typeURL)
	tail = appendString(tail, respNonce, r.nonce)
	for _, n := range r.removed {
		// A repeated string keeps empty elements.
		tail = protowire.AppendTag(tail, respRemovedResources, protowire.BytesType)
		tail = protowire.AppendString(tail, n)
	}
	out := make(mem.BufferSlice, 0, len(r.resources)+2)
	if len(head) > 0 {
		out = append(out, mem.SliceBuffer(head))
	}
	for _, e := range r.resources {
		out = append(out, e.wire)
	}
	if len(tail) > 0 {
		out = append(out, mem.SliceBuffer(tail))
	}
	return &wireResponse{bufs: out}
}

// wireResponse is an encoded DeltaDiscoveryResponse; wireCodec writes it.
type wireResponse struct {
	bufs mem.BufferSlice // read-only; SliceBuffers, so gRPC's Free is a no-op
}

// wireCodec is gRPC's "proto" codec plus *wireResponse.
type wireCodec struct {
	base encoding.CodecV2
}

func (c *wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireResponse); ok {
		// Made for this one send; gRPC frees the buffers (a no-op for
		// SliceBuffer) and never writes into them.
		return w.bufs, nil
	}
	return c.base.Marshal(v)
}

func (c *wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.base.Unmarshal(data, v) }

func (c *wireCodec) Name() string { return protocodec.Name }

var registeredCodec *wireCodec

func init() {
	base := encoding.GetCodecV2(protocodec.Name)
	if base == nil {
		panic(fmt.Sprintf("xds: gRPC has no %q codec to extend", protocodec.Name))
	}
	registeredCodec = &wireCodec{base: base}
	encoding.RegisterCodecV2(registeredCodec)
}

// wireCodecActive reports whether gRPC's "proto" codec is ours. Codecs are
// registered only by init functions, so the answer is fixed once main runs.
var wireCodecActive = sync.OnceValue(func() bool {
	c, ok := encoding.GetCodecV2(protocodec.Name).(*wireCodec)
	return ok && c == registeredCodec
})
