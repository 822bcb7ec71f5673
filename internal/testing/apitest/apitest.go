// Package apitest holds test helpers for the generated protobuf packages under
// internal/api: it checks a proto file's descriptors against a hand-written
// wire contract (field numbers, enum values) and lists the fields actually
// present in encoded bytes. It is imported only by tests; it is not a
// protobuf utility library for production code.
package apitest

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Contract is the wire contract of one proto file. Names are relative to the
// proto package; nested types use dots ("LoadBalancing.Scope"). Each listed
// message or enum must have exactly the listed fields or values, so a field
// added to the .proto without adding it here fails the test.
type Contract struct {
	Package  protoreflect.FullName
	Messages map[string]map[string]protoreflect.FieldNumber
	Enums    map[string]map[string]protoreflect.EnumNumber
}

// CheckContract fails t for every difference between fd and c.
func CheckContract(t *testing.T, fd protoreflect.FileDescriptor, c Contract) {
	t.Helper()
	if fd.Package() != c.Package {
		t.Fatalf("proto package = %q, want %q", fd.Package(), c.Package)
	}
	for name, fields := range c.Messages {
		md, ok := Find(fd, name).(protoreflect.MessageDescriptor)
		if !ok {
			t.Errorf("message %s missing", name)
			continue
		}
		if got := md.Fields().Len(); got != len(fields) {
			t.Errorf("%s has %d fields, the contract lists %d", name, got, len(fields))
		}
		for fname, num := range fields {
			f := md.Fields().ByName(protoreflect.Name(fname))
			switch {
			case f == nil:
				t.Errorf("%s.%s missing", name, fname)
			case f.Number() != num:
				t.Errorf("%s.%s is field %d, want %d", name, fname, f.Number(), num)
			}
		}
	}
	for name, values := range c.Enums {
		ed, ok := Find(fd, name).(protoreflect.EnumDescriptor)
		if !ok {
			t.Errorf("enum %s missing", name)
			continue
		}
		if got := ed.Values().Len(); got != len(values) {
			t.Errorf("%s has %d values, the contract lists %d", name, got, len(values))
		}
		for vname, num := range values {
			v := ed.Values().ByName(protoreflect.Name(vname))
			switch {
			case v == nil:
				t.Errorf("%s.%s missing", name, vname)
			case v.Number() != num:
				t.Errorf("%s.%s = %d, want %d", name, vname, v.Number(), num)
			}
		}
	}
}

// Find returns the registered descriptor named name relative to fd's package,
// or nil.
func Find(fd protoreflect.FileDescriptor, name string) protoreflect.Descriptor {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(string(fd.Package()) + "." + name))
	if err != nil {
		return nil
	}
	return d
}

// RoundTrip marshals m, unmarshals it into a fresh message of the same type
// and fails t unless the result equals m. It returns the encoding.
func RoundTrip(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("marshal %T: %v", m, err)
	}
	got := m.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(b, got); err != nil {
		t.Fatalf("unmarshal %T: %v", m, err)
	}
	if !proto.Equal(got, m) {
		t.Fatalf("round trip changed the message:\n got %v\nwant %v", got, m)
	}
	return b
}

// CheckPopulated fails t for every field of m that is not set, so that
// round-trip fixtures grow with the .proto.
func CheckPopulated(t *testing.T, m proto.Message) {
	t.Helper()
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); !r.Has(f) {
			t.Errorf("fixture %s leaves %s unset", r.Descriptor().FullName(), f.Name())
		}
	}
}

// WireFields lists the top-level field numbers in the encoding b with their
// wire types.
func WireFields(t *testing.T, b []byte) map[protowire.Number]protowire.Type {
	t.Helper()
	out := map[protowire.Number]protowire.Type{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("bad tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Fatalf("bad field %d: %v", num, protowire.ParseError(m))
		}
		b = b[m:]
		out[num] = typ
	}
	return out
}

// WantOnWire fails t unless every field in want is present in the encoding b
// with the given wire type.
func WantOnWire(t *testing.T, b []byte, want map[protowire.Number]protowire.Type) {
	t.Helper()
	got := WireFields(t, b)
	for num, typ := range want {
		gt, ok := got[num]
		switch {
		case !ok:
			t.Errorf("field %d not on the wire (have %v)", num, got)
		case gt != typ:
			t.Errorf("field %d has wire type %d, want %d", num, gt, typ)
		}
	}
}
