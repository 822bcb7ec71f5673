package apicoverage

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// world is a namespace bound to a waypoint with one service, where each
// proof adds one object.
const world = `
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: reviews, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec: {selector: {app: reviews}, clusterIP: 10.96.0.20, ports: [{name: http, port: 9080}]}
---
apiVersion: v1
kind: Pod
metadata: {name: reviews-v1, namespace: demo, labels: {app: reviews, version: v1}}
spec: {nodeName: node0, serviceAccountName: reviews, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.1}]}
`

// bases are the objects a proof sets one field on: each is valid and is
// translated without a problem as it is.
var bases = map[string]string{
	"VirtualService": `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: subject, namespace: demo}
spec:
  hosts: [reviews]
  http: [{route: [{destination: {host: reviews}}]}]
`,
	"DestinationRule": `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: subject, namespace: demo}
spec:
  host: reviews
  trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}
  subsets: [{name: v1, labels: {version: v1}, trafficPolicy: {loadBalancer: {simple: RANDOM}}}]
`,
	"AuthorizationPolicy": `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: subject, namespace: demo}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: ALLOW
  rules: [{from: [{source: {principals: [cluster.local/ns/demo/sa/reviews]}}]}]
`,
	"Telemetry": `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: subject, namespace: demo}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  tracing: [{randomSamplingPercentage: 10}]
  metrics: [{overrides: [{match: {metric: REQUEST_COUNT}, disabled: true}]}]
`,
}

// TestRefusedFieldsAreRefused proves each refused field of the kinds above
// by construction: it sets the field on a valid object, translates, and
// requires the object's status to name the field's path. A field the table
// calls refused but the translation silently drops fails here.
func TestRefusedFieldsAreRefused(t *testing.T) {
	for kind, base := range bases {
		for _, e := range table[kind] {
			if e.State != Refused || !strings.HasPrefix(e.Path, "spec.") {
				continue
			}
			t.Run(kind+"/"+e.Path, func(t *testing.T) {
				sts := translateWith(t, kind, base, e.Path)
				want := concrete(e.Path)
				// A list or map is named as a whole ("...sourceLabels") or by
				// its first element ("...ipBlocks[0]").
				want = strings.TrimSuffix(strings.TrimSuffix(want, "[0]"), "[k]")
				st, ok := statusOf(sts, kind, "demo/subject")
				if !ok {
					t.Fatalf("no status for %s demo/subject", kind)
				}
				for _, inv := range append(append([]string(nil), st.Invalid...), st.Message) {
					if strings.Contains(inv, want) {
						return
					}
				}
				t.Fatalf("setting %s: the status does not name %s: %+v", e.Path, want, st)
			})
		}
		// The base itself must translate cleanly, or every proof above
		// would pass on the base's own problem.
		t.Run(kind+"/base", func(t *testing.T) {
			sts := translateWith(t, kind, base, "")
			st, ok := statusOf(sts, kind, "demo/subject")
			if !ok || len(st.Invalid) > 0 {
				t.Fatalf("base %s: status %+v", kind, st)
			}
		})
	}
}

// concrete turns a table path into the path a status names for the first
// element of each list and the key "k" of each map.
func concrete(path string) string {
	path = strings.ReplaceAll(path, "[]", "[0]")
	return strings.ReplaceAll(path, "{}", "[k]")
}

func translateWith(t *testing.T, kind, base, path string) []translate.PolicyStatus {
	t.Helper()
	var objs cluster.Objects
	if errs := cluster.Decode("world.yaml", []byte(world+"---\n"+base), &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	if path != "" {
		spec := specOf(t, &objs, kind)
		if err := setPath(spec.ProtoReflect(), strings.Split(strings.TrimPrefix(path, "spec."), ".")); err != nil {
			t.Fatalf("set %s: %v", path, err)
		}
	}
	objs.Sort()
	cfg := translate.Config{ClusterID: "Kubernetes"}
	res := translate.Translate(cfg, &objs, nil)
	_, sts := translate.WaypointConfigs(cfg, &objs, res)
	return sts
}

func specOf(t *testing.T, objs *cluster.Objects, kind string) proto.Message {
	t.Helper()
	switch kind {
	case "VirtualService":
		return &objs.VirtualServices[0].Spec
	case "DestinationRule":
		return &objs.DestinationRules[0].Spec
	case "AuthorizationPolicy":
		return &objs.AuthorizationPolicies[0].Spec
	case "Telemetry":
		return &objs.Telemetries[0].Spec
	}
	t.Fatalf("no spec for %s", kind)
	return nil
}

func statusOf(sts []translate.PolicyStatus, kind, name string) (translate.PolicyStatus, bool) {
	for _, s := range sts {
		if s.Kind == kind && s.Name == name {
			return s, true
		}
	}
	return translate.PolicyStatus{}, false
}

var segment = regexp.MustCompile(`^([A-Za-z0-9_]+)(\[\]|\{\})?$`)

// setPath sets the field at segs below m to a value that is not its zero
// value: the first element of a list (created when the list is empty), the
// key "k" of a map, an empty message, or a non-zero scalar.
func setPath(m protoreflect.Message, segs []string) error {
	sm := segment.FindStringSubmatch(segs[0])
	if sm == nil {
		return fmt.Errorf("bad segment %q", segs[0])
	}
	fd := m.Descriptor().Fields().ByJSONName(sm[1])
	if fd == nil {
		return fmt.Errorf("%s has no field %q", m.Descriptor().FullName(), sm[1])
	}
	last := len(segs) == 1
	switch {
	case fd.IsList():
		l := m.Mutable(fd).List()
		if l.Len() == 0 {
			if fd.Kind() == protoreflect.MessageKind {
				l.Append(l.NewElement())
			} else {
				l.Append(nonZero(fd))
			}
		}
		if last {
			return nil
		}
		return setPath(l.Get(0).Message(), segs[1:])
	case fd.IsMap():
		mp := m.Mutable(fd).Map()
		key := protoreflect.ValueOfString("k").MapKey()
		if fd.MapValue().Kind() == protoreflect.MessageKind {
			v := mp.Mutable(key)
			if last {
				return nil
			}
			return setPath(v.Message(), segs[1:])
		}
		mp.Set(key, nonZero(fd.MapValue()))
		return nil
	case fd.Kind() == protoreflect.MessageKind:
		sub := m.Mutable(fd).Message()
		if last {
			return nil
		}
		return setPath(sub, segs[1:])
	default:
		if !last {
			return fmt.Errorf("%s is a scalar", fd.FullName())
		}
		m.Set(fd, nonZero(fd))
		return nil
	}
}

func nonZero(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get(vals.Len() - 1).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1)
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	}
	return protoreflect.Value{}
}
