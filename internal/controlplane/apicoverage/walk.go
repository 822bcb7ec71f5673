package apicoverage

import (
	"reflect"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// leafMessages are well-known protobuf messages a user writes as one value
// (a duration string, a wrapped number, free-form JSON): their inner fields
// are encoding, not API.
var leafMessages = map[protoreflect.FullName]bool{
	"google.protobuf.Duration":    true,
	"google.protobuf.Timestamp":   true,
	"google.protobuf.BoolValue":   true,
	"google.protobuf.UInt32Value": true,
	"google.protobuf.Int32Value":  true,
	"google.protobuf.UInt64Value": true,
	"google.protobuf.Int64Value":  true,
	"google.protobuf.DoubleValue": true,
	"google.protobuf.StringValue": true,
	"google.protobuf.Struct":      true,
	"google.protobuf.Value":       true,
	"google.protobuf.Any":         true,
	"google.protobuf.Empty":       true,
}

// protoFields lists every field path below md as users write it in YAML:
// JSON names joined by dots, "[]" after a repeated field and "{}" after a
// map. A message that contains itself (VirtualService delegates do not, but
// Istio's StringMatch-like unions could) is walked once per path.
func protoFields(prefix string, md protoreflect.MessageDescriptor) []string {
	var out []string
	walkProto(prefix, md, map[protoreflect.FullName]bool{}, &out)
	sort.Strings(out)
	return out
}

func walkProto(prefix string, md protoreflect.MessageDescriptor, onPath map[protoreflect.FullName]bool, out *[]string) {
	onPath[md.FullName()] = true
	defer delete(onPath, md.FullName())
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		path := join(prefix, fd.JSONName())
		switch {
		case fd.IsMap():
			path += "{}"
			*out = append(*out, path)
			if v := fd.MapValue(); v.Kind() == protoreflect.MessageKind && !leafMessages[v.Message().FullName()] && !onPath[v.Message().FullName()] {
				walkProto(path, v.Message(), onPath, out)
			}
			continue
		case fd.IsList():
			path += "[]"
		}
		*out = append(*out, path)
		if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
			m := fd.Message()
			if !leafMessages[m.FullName()] && !onPath[m.FullName()] {
				walkProto(path, m, onPath, out)
			}
		}
	}
}

// leafTypes are Go types of the Kubernetes API that a user writes as one
// value (a quantity, a duration, an int-or-string).
var leafTypes = map[string]bool{
	"k8s.io/apimachinery/pkg/apis/meta/v1.Duration":      true,
	"k8s.io/apimachinery/pkg/apis/meta/v1.Time":          true,
	"k8s.io/apimachinery/pkg/apis/meta/v1.MicroTime":     true,
	"k8s.io/apimachinery/pkg/api/resource.Quantity":      true,
	"k8s.io/apimachinery/pkg/util/intstr.IntOrString":    true,
	"k8s.io/apimachinery/pkg/apis/meta/v1.LabelSelector": false,
}

// goFields lists every field path below t (a struct type of the Kubernetes
// or Gateway API Go types) by its JSON tags, in the same form as
// protoFields. Embedded structs with ",inline" or no name add their fields
// at the same level.
func goFields(prefix string, t reflect.Type) []string {
	var out []string
	walkGo(prefix, t, map[reflect.Type]bool{}, &out)
	sort.Strings(out)
	return out
}

func walkGo(prefix string, t reflect.Type, onPath map[reflect.Type]bool, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || leafTypes[t.PkgPath()+"."+t.Name()] || onPath[t] {
		return
	}
	onPath[t] = true
	defer delete(onPath, t)
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			walkGo(prefix, f.Type, onPath, out)
			continue
		}
		if name == "" {
			name = f.Name
		}
		path := join(prefix, name)
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch ft.Kind() {
		case reflect.Slice, reflect.Array:
			if ft.Elem().Kind() == reflect.Uint8 { // []byte is one value
				*out = append(*out, path)
				continue
			}
			path += "[]"
			ft = ft.Elem()
		case reflect.Map:
			path += "{}"
			ft = ft.Elem()
		}
		*out = append(*out, path)
		walkGo(path, ft, onPath, out)
	}
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}
