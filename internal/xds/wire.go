package xds

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// The client's messages, encoded and decoded here rather than through
// go-control-plane's generated types, whose packages (with everything
// discovery.proto and base.proto import) would be most of a megabyte of the
// node proxy's binary for five messages of which the client uses a dozen
// fields (doc.go).
//
// Field numbers are those of envoy's data-plane-api
// (envoy/service/discovery/v3/discovery.proto, envoy/config/core/v3/base.proto),
// google/protobuf/{any,struct}.proto and google/rpc/status.proto;
// TestWire* in wire_test.go check both directions against go-control-plane's
// generated types. Decoding follows the protobuf rules the generated code
// follows: fields in any order, the last value of a singular field wins, a
// singular message field seen twice is merged, a known field number with an
// unexpected wire type and every unknown field are skipped, and strings must
// be valid UTF-8 (proto3). Malformed input is an error naming the field.
// Fields the client does not read are skipped like unknown ones, their
// contents unexamined: where the generated type would reject, say, a
// malformed control_plane, the client accepts the response (FuzzHandleResponse
// checks that it accepts whatever the generated type accepts, identically).

// DeltaDiscoveryRequest field numbers.
const (
	reqNode                     = 1
	reqTypeURL                  = 2
	reqResourceNamesSubscribe   = 3
	reqResourceNamesUnsubscribe = 4
	reqInitialResourceVersions  = 5
	reqResponseNonce            = 6
	reqErrorDetail              = 7
)

// DeltaDiscoveryResponse field numbers.
const (
	respSystemVersionInfo = 1
	respResources         = 2
	respTypeURL           = 4
	respNonce             = 5
	respRemovedResources  = 6
)

// Resource, Any, Node, Struct (and its map entries), Value and
// google.rpc.Status field numbers.
const (
	resVersion    = 1
	resResource   = 2
	resName       = 3
	anyTypeURL    = 1
	anyValue      = 2
	nodeID        = 1
	nodeMetadata  = 3
	structFields  = 1
	mapEntryKey   = 1
	mapEntryValue = 2
	valueString   = 3
	statusCode    = 1
	statusMessage = 2
)

// Field names by number, for errors.
var (
	respFieldNames = []string{respSystemVersionInfo: "system_version_info", respResources: "resources",
		respTypeURL: "type_url", respNonce: "nonce", respRemovedResources: "removed_resources"}
	resFieldNames = []string{resVersion: "version", resResource: "resource", resName: "name"}
	anyFieldNames = []string{anyTypeURL: "type_url", anyValue: "value"}
)

// deltaRequest is the part of envoy.service.discovery.v3.DeltaDiscoveryRequest
// the client sends.
type deltaRequest struct {
	// node is an encoded envoy.config.core.v3.Node (encodeNode), sent in
	// the first request of a stream. nil: not sent.
	node            []byte
	typeURL         string
	subscribe       []string
	unsubscribe     []string
	initialVersions map[string]string // initial_resource_versions
	responseNonce   string
	// errorDetail makes the request a NACK. nil: an ACK (or a subscription).
	errorDetail *rpcStatus
}

// rpcStatus is google.rpc.Status without details.
type rpcStatus struct {
	code    int32
	message string
}

// marshal encodes r, fields in number order, empty strings and maps left
// out as proto3 leaves them out (repeated strings keep empty elements).
func (r *deltaRequest) marshal() []byte {
	size := sizeBytesField(reqNode, len(r.node), r.node != nil) +
		sizeString(reqTypeURL, r.typeURL) +
		sizeStrings(reqResourceNamesSubscribe, r.subscribe) +
		sizeStrings(reqResourceNamesUnsubscribe, r.unsubscribe) +
		sizeString(reqResponseNonce, r.responseNonce)
	for k, v := range r.initialVersions {
		size += sizeBytesField(reqInitialResourceVersions, sizeMapEntry(k, v), true)
	}
	var status int
	if r.errorDetail != nil {
		status = r.errorDetail.size()
		size += sizeBytesField(reqErrorDetail, status, true)
	}

	b := make([]byte, 0, size)
	if r.node != nil {
		b = protowire.AppendTag(b, reqNode, protowire.BytesType)
		b = protowire.AppendBytes(b, r.node)
	}
	b = appendString(b, reqTypeURL, r.typeURL)
	b = appendStrings(b, reqResourceNamesSubscribe, r.subscribe)
	b = appendStrings(b, reqResourceNamesUnsubscribe, r.unsubscribe)
	for k, v := range r.initialVersions {
		b = appendMapEntry(b, reqInitialResourceVersions, k, v)
	}
	b = appendString(b, reqResponseNonce, r.responseNonce)
	if r.errorDetail != nil {
		b = protowire.AppendTag(b, reqErrorDetail, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(status))
		b = r.errorDetail.append(b)
	}
	return b
}

func (s *rpcStatus) size() int {
	n := sizeString(statusMessage, s.message)
	if s.code != 0 {
		n += protowire.SizeTag(statusCode) + protowire.SizeVarint(uint64(int64(s.code)))
	}
	return n
}

func (s *rpcStatus) append(b []byte) []byte {
	if s.code != 0 {
		b = protowire.AppendTag(b, statusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(s.code))) // int32: sign-extended
	}
	return appendString(b, statusMessage, s.message)
}

// encodeNode encodes the envoy.config.core.v3.Node the client identifies
// itself with: id and metadata, a Struct of string Values, keys sorted so
// the encoding is the same on every run.
func encodeNode(id string, metadata map[string]string) []byte {
	var md []byte
	for _, k := range slices.Sorted(maps.Keys(metadata)) {
		// Value{string_value}: a oneof member, written even when "".
		v := metadata[k]
		value := protowire.AppendString(protowire.AppendTag(nil, valueString, protowire.BytesType), v)
		entryLen := sizeBytesField(mapEntryKey, len(k), true) + sizeBytesField(mapEntryValue, len(value), true)
		md = protowire.AppendTag(md, structFields, protowire.BytesType)
		md = protowire.AppendVarint(md, uint64(entryLen))
		md = protowire.AppendTag(md, mapEntryKey, protowire.BytesType)
		md = protowire.AppendString(md, k)
		md = protowire.AppendTag(md, mapEntryValue, protowire.BytesType)
		md = protowire.AppendBytes(md, value)
	}
	b := appendString(nil, nodeID, id)
	b = protowire.AppendTag(b, nodeMetadata, protowire.BytesType)
	return protowire.AppendBytes(b, md)
}

// deltaResponse is the part of envoy.service.discovery.v3.DeltaDiscoveryResponse
// the client reads; other fields (control_plane, removed_resource_names,
// resource_errors, a Resource's aliases, ttl, cache_control, metadata) are
// skipped.
type deltaResponse struct {
	systemVersionInfo string
	typeURL           string
	nonce             string
	resources         []resource
	removed           []string // removed_resources
	size              int      // encoded length, for istio_xds_message_bytes_total
}

// resource is an envoy.service.discovery.v3.Resource.
type resource struct {
	name    string
	version string
	// hasBody: the resource field (an Any) was present, even if empty.
	hasBody  bool
	bodyType string // Any.type_url
	// body is Any.value. It aliases the buffer the response was decoded
	// from: read it before the next response, copy what outlives it.
	body []byte
}

// errMalformed wraps every decoding error.
var errMalformed = errors.New("malformed")

// unmarshal decodes b into r (which it resets). The resources' bodies alias b.
func (r *deltaResponse) unmarshal(b []byte) error {
	*r = deltaResponse{size: len(b)}
	// Count the resources first (tags and lengths only), so that a full
	// sync's slice is allocated once; errors are the second pass's to report.
	n := 0
	_ = forFields(b, nil, func(num protowire.Number, typ protowire.Type, _ []byte) error {
		if num == respResources && typ == protowire.BytesType {
			n++
		}
		return nil
	})
	if n > 0 {
		r.resources = make([]resource, 0, n)
	}
	err := forFields(b, respFieldNames, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil // a known number with another wire type counts as unknown
		}
		var err error
		switch num {
		case respSystemVersionInfo:
			r.systemVersionInfo, err = str(v, "system_version_info")
		case respTypeURL:
			r.typeURL, err = str(v, "type_url")
		case respNonce:
			r.nonce, err = str(v, "nonce")
		case respRemovedResources:
			if !utf8.Valid(v) { // the index named only on error: no Sprintf per name
				return fmt.Errorf("removed_resources[%d]: %w: invalid UTF-8", len(r.removed), errMalformed)
			}
			r.removed = append(r.removed, string(v))
		case respResources:
			var res resource
			if err = res.unmarshal(v); err != nil {
				err = fmt.Errorf("resources[%d].%w", len(r.resources), err)
			}
			r.resources = append(r.resources, res)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("xds: decode DeltaDiscoveryResponse: %w", err)
	}
	return nil
}

func (res *resource) unmarshal(b []byte) error {
	return forFields(b, resFieldNames, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return nil
		}
		var err error
		switch num {
		case resName:
			res.name, err = str(v, "name")
		case resVersion:
			res.version, err = str(v, "version")
		case resResource:
			// A message field seen twice is merged: the later one's
			// fields overwrite, the others stay.
			res.hasBody = true
			err = forFields(v, anyFieldNames, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if typ != protowire.BytesType {
					return nil
				}
				var err error
				switch num {
				case anyTypeURL:
					res.bodyType, err = typeURL(v)
				case anyValue:
					res.body = v
				}
				return err
			})
			if err != nil {
				err = fmt.Errorf("resource.%w", err)
			}
		}
		return err
	})
}

// forFields calls fn with each field of the message b: its number, wire type
// and, for a length-delimited field, its contents (other values are skipped
// and fn gets nil). It stops at fn's first error. names name the message's
// fields in errors.
func forFields(b []byte, names []string, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("tag: %w: %w", errMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("%s: %w: %w", fieldName(names, num), errMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// typeURL is str for an Any's type_url, without a copy for the types the
// client subscribes to (every body of a full sync has one of them).
func typeURL(b []byte) (string, error) {
	for _, t := range [...]string{AddressType, AuthorizationType, WaypointType} {
		if string(b) == t {
			return t, nil
		}
	}
	return str(b, "type_url")
}

func fieldName(names []string, num protowire.Number) string {
	if int(num) < len(names) && names[num] != "" {
		return names[num]
	}
	return fmt.Sprintf("field %d", num)
}

// str copies a string field, which proto3 requires to be valid UTF-8.
func str(b []byte, field string) (string, error) {
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%s: %w: invalid UTF-8", field, errMalformed)
	}
	return string(b), nil
}

func sizeString(num protowire.Number, s string) int {
	return sizeBytesField(num, len(s), s != "")
}

// sizeBytesField is the size of a length-delimited field of n bytes, 0 when
// !present.
func sizeBytesField(num protowire.Number, n int, present bool) int {
	if !present {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func sizeStrings(num protowire.Number, ss []string) int {
	n := 0
	for _, s := range ss {
		n += sizeBytesField(num, len(s), true)
	}
	return n
}

// sizeMapEntry is the size of a map<string, string> entry's message; both
// key and value are written, even when empty, as the generated code does.
func sizeMapEntry(k, v string) int {
	return sizeBytesField(mapEntryKey, len(k), true) + sizeBytesField(mapEntryValue, len(v), true)
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendStrings(b []byte, num protowire.Number, ss []string) []byte {
	for _, s := range ss {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b
}

func appendMapEntry(b []byte, num protowire.Number, k, v string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeMapEntry(k, v)))
	b = protowire.AppendTag(b, mapEntryKey, protowire.BytesType)
	b = protowire.AppendString(b, k)
	b = protowire.AppendTag(b, mapEntryValue, protowire.BytesType)
	return protowire.AppendString(b, v)
}

// codec is the gRPC codec of the client's ADS stream, passed to that one
// call with grpc.ForceCodecV2: it writes a *deltaRequest and reads a
// *deltaResponse and nothing else. It is named "proto" (the stream's
// content-type is application/grpc+proto, which every gRPC server maps to
// its protobuf codec) and is not registered, so the process's other gRPC
// clients and servers keep gRPC's own proto codec.
type codec struct{}

var _ encoding.CodecV2 = codec{}

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*deltaRequest)
	if !ok {
		return nil, fmt.Errorf("xds: codec cannot marshal %T", v)
	}
	// A SliceBuffer: gRPC's Free after the write is a no-op.
	return mem.BufferSlice{mem.SliceBuffer(r.marshal())}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*deltaResponse)
	if !ok {
		return fmt.Errorf("xds: codec cannot unmarshal into %T", v)
	}
	// gRPC frees data's buffers when this returns; the response's bodies
	// alias this copy instead.
	return r.unmarshal(data.Materialize())
}

func (codec) Name() string { return protocodec.Name }
