package translate

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

const telemetryMeshYAML = `
defaultProviders: {metrics: [prometheus]}
defaultConfig: {tracing: {sampling: 5}}
extensionProviders:
- name: prometheus
  prometheus: {}
- name: stdout
  envoyFileAccessLog: {path: /dev/stdout}
- name: json-file
  envoyFileAccessLog: {path: /var/log/access.json, logFormat: {labels: {code: "%RESPONSE_CODE%", path: "%REQ(:PATH)%"}}}
- name: otel-logs
  envoyOtelAls: {service: otel.istio-system.svc.cluster.local, port: 4317}
- name: otel-tracing
  opentelemetry: {service: otel.istio-system.svc.cluster.local, port: 4318, http: {path: /v1/traces, timeout: 2s, headers: [{name: x-tenant, value: mesh}]}}
- name: otel-grpc
  opentelemetry: {service: otel.istio-system.svc.cluster.local, port: 4317}
- name: zipkin
  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}
`

func telemetryConfig(t *testing.T) Config {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(telemetryMeshYAML))
	if err != nil {
		t.Fatal(err)
	}
	var mc meshv1alpha1.MeshConfig
	if err := protojson.Unmarshal(j, &mc); err != nil {
		t.Fatal(err)
	}
	tm, problems := MeshTelemetry(&mc)
	if !slices.ContainsFunc(problems, func(p string) bool { return strings.HasPrefix(p, "zipkin: provider zipkin") }) {
		t.Errorf("problems %q: want zipkin refused", problems)
	}
	cfg := LocalDefaults()
	cfg.Telemetry = tm
	return cfg
}

func telemetryConfigs(t *testing.T, cfg Config, extra string) (map[string]*waypointapi.Config, map[string]PolicyStatus) {
	t.Helper()
	objs := tenantObjects(t, extra)
	res := Translate(cfg, objs, nil)
	wps, statuses := WaypointConfigs(cfg, objs, res)
	byName := map[string]PolicyStatus{}
	for _, s := range statuses {
		if s.Kind == kindTelemetry {
			byName[s.Name] = s
		}
	}
	return wps, byName
}

func serviceOf(c *waypointapi.Config, name string) *waypointapi.Service {
	for _, s := range c.GetServices() {
		if s.GetName() == name {
			return s
		}
	}
	return nil
}

func TestMeshTelemetry(t *testing.T) {
	tm := telemetryConfig(t).Telemetry
	if got := tm.Providers["stdout"].FileLog; got.GetPath() != "/dev/stdout" || got.GetFormat() != nil {
		t.Errorf("stdout = %v", got)
	}
	if got := tm.Providers["json-file"].FileLog.GetFormat().GetLabels(); got["code"] != "%RESPONSE_CODE%" {
		t.Errorf("json-file labels = %v", got)
	}
	if got := tm.Providers["otel-logs"].OtelLog; got.GetPort() != 4317 || got.GetLogName() != "otel_envoy_accesslog" {
		t.Errorf("otel-logs = %v", got)
	}
	tr := tm.Providers["otel-tracing"].Tracing
	if tr.GetProtocol() != waypointapi.TracingProvider_HTTP || tr.GetHttpPath() != "/v1/traces" || tr.GetTimeoutMs() != 2000 || tr.GetHeaders()["x-tenant"] != "mesh" {
		t.Errorf("otel-tracing = %v", tr)
	}
	if g := tm.Providers["otel-grpc"].Tracing; g.GetProtocol() != waypointapi.TracingProvider_GRPC || g.GetPort() != 4317 {
		t.Errorf("otel-grpc = %v", g)
	}
	if !tm.Providers["prometheus"].Prometheus || tm.Providers["zipkin"].Unsupported != "zipkin" || tm.DefaultSampling != 5 {
		t.Errorf("prometheus/zipkin/sampling: %+v %+v %v", tm.Providers["prometheus"], tm.Providers["zipkin"], tm.DefaultSampling)
	}
}

// TestTelemetryScope: root namespace, then the waypoint's namespace, then
// a targetRef to the waypoint Gateway; the most specific wins field by
// field. A selector never selects a waypoint (Istio's policy attachment).
func TestTelemetryScope(t *testing.T) {
	cfg := telemetryConfig(t)
	wps, st := telemetryConfigs(t, cfg, `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: mesh-default, namespace: istio-system}
spec:
  accessLogging: [{providers: [{name: stdout}]}]
  tracing: [{providers: [{name: otel-tracing}], randomSamplingPercentage: 10, customTags: {team: {literal: {value: mesh}}}}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: ns, namespace: shop}
spec:
  metrics:
  - overrides:
    - match: {metric: REQUEST_COUNT}
      disabled: true
    - match: {metric: ALL_METRICS, mode: SERVER}
      tagOverrides:
        request_host_tag_is_not_standard: {value: request.host}
    - match: {metric: REQUEST_DURATION, mode: CLIENT}
      disabled: true
  accessLogging: [{providers: [{name: json-file}], filter: {expression: "response.code >= 400"}}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: wp, namespace: shop}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  accessLogging: [{providers: [{name: stdout}], disabled: true}]
  tracing:
  - randomSamplingPercentage: 50
    useRequestIdForTraceSampling: false
    customTags:
      user: {header: {name: X-User, defaultValue: anon}}
      pod: {environment: {name: POD_NAME}}
  metrics:
  - overrides:
    - match: {metric: TCP_SENT_BYTES}
      tagOverrides:
        destination_port_is_not_ours: {operation: REMOVE}
        response_flags: {operation: REMOVE}
        source_app: {value: "request.headers['x-app']"}
        request_protocol: {value: "'h'"}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: by-selector, namespace: shop}
spec:
  selector: {matchLabels: {gateway.networking.k8s.io/gateway-name: waypoint}}
  tracing: [{randomSamplingPercentage: 99}]
`)
	tel := wps["shop/waypoint"].GetTelemetry()
	if tel == nil {
		t.Fatal("no telemetry")
	}
	if want := []string{"istio-system/mesh-default", "shop/ns", "shop/wp"}; !slices.Equal(tel.GetSources(), want) {
		t.Errorf("sources = %q, want %q", tel.GetSources(), want)
	}
	tr := tel.GetTracing()
	if tr.GetRandomSamplingPercentage() != 50 || tr.GetProvider().GetName() != "otel-tracing" || tr.GetServiceName() != "waypoint.shop" ||
		tr.GetUseRequestIdForTraceSampling() {
		t.Errorf("tracing = %v", tr)
	}
	var tags []string
	for _, ct := range tr.GetCustomTags() {
		tags = append(tags, ct.GetName()+"="+ct.GetLiteral()+ct.GetHeader()+ct.GetEnvironment()+"|"+ct.GetDefaultValue())
	}
	if want := []string{"pod=POD_NAME|", "team=mesh|", "user=x-user|anon"}; !slices.Equal(tags, want) {
		t.Errorf("custom tags = %q, want %q", tags, want)
	}
	al := tel.GetAccessLogging()
	var provs []string
	for _, p := range al.GetProviders() {
		provs = append(provs, p.GetName())
	}
	// stdout: enabled at the root, disabled by the waypoint's own.
	if !slices.Equal(provs, []string{"json-file"}) {
		t.Errorf("access log providers = %q", provs)
	}
	// Only REQUEST_COUNT is disabled (the CLIENT-mode override does not
	// apply at a waypoint); TCP_SENT_BYTES has its tags; the override
	// with a label that is not Istio's is refused whole.
	var got []string
	for _, o := range tel.GetMetricOverrides() {
		s := o.GetMetric().String()
		if o.GetDisabled() {
			s += " disabled"
		}
		for _, tg := range o.GetTags() {
			s += " " + tg.GetName()
			if tg.GetRemove() {
				s += "-"
			}
		}
		got = append(got, s)
	}
	if want := []string{"REQUEST_COUNT disabled"}; !slices.Equal(got, want) {
		t.Errorf("overrides = %q, want %q", got, want)
	}
	if s := st["shop/ns"]; !s.Sent || !slices.ContainsFunc(s.Invalid, func(i string) bool { return strings.Contains(i, "request_host_tag_is_not_standard") }) {
		t.Errorf("shop/ns status = %+v", s)
	}
	if s := st["shop/wp"]; !slices.ContainsFunc(s.Invalid, func(i string) bool { return strings.Contains(i, "destination_port_is_not_ours") }) {
		t.Errorf("shop/wp status = %+v", s)
	}
	if s := st["shop/by-selector"]; s.Sent || !strings.Contains(s.Message, "selector selects no waypoint") {
		t.Errorf("shop/by-selector status = %+v", s)
	}
	if s := st["istio-system/mesh-default"]; !s.Sent || !strings.HasPrefix(s.Message, EnforcedByWaypoint+"shop/waypoint") {
		t.Errorf("mesh-default status = %+v", s)
	}
}

func TestTelemetryTagOverrides(t *testing.T) {
	cfg := telemetryConfig(t)
	wps, st := telemetryConfigs(t, cfg, `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: wp, namespace: shop}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  metrics:
  - overrides:
    - match: {metric: TCP_SENT_BYTES}
      tagOverrides:
        response_flags: {operation: REMOVE}
        source_app: {value: "request.headers['x-app']"}
        request_protocol: {value: "'h'"}
    - match: {metric: REQUEST_COUNT}
      tagOverrides:
        destination_app: {value: "has(request.headers['x']) ? 'a' : 'b'"}
`)
	ov := wps["shop/waypoint"].GetTelemetry().GetMetricOverrides()
	if len(ov) != 1 || ov[0].GetMetric() != waypointapi.Metric_TCP_SENT_BYTES {
		t.Fatalf("overrides = %v", ov)
	}
	want := []*waypointapi.TagOverride{
		{Name: "request_protocol", Value: &waypointapi.TagValue{Expression: "'h'", Literal: "h"}},
		{Name: "response_flags", Remove: true},
		{Name: "source_app", Value: &waypointapi.TagValue{Expression: "request.headers['x-app']", Attribute: waypointapi.Attribute_REQUEST_HEADER, Header: "x-app"}},
	}
	for i, w := range want {
		if i >= len(ov[0].GetTags()) || !proto.Equal(ov[0].GetTags()[i], w) {
			t.Errorf("tags = %v, want %v", ov[0].GetTags(), want)
			break
		}
	}
	if s := st["shop/wp"]; !slices.ContainsFunc(s.Invalid, func(i string) bool { return strings.Contains(i, "tagOverrides.destination_app.value") }) {
		t.Errorf("status = %+v", s)
	}
}

// TestTelemetryTenantIsolation is the attack: the tenant of namespace
// evil writes Telemetry objects that try to change the telemetry of the
// waypoint of namespace shop and of its service cart. None may: a
// namespace-wide Telemetry applies to its own namespace's waypoints only,
// a targetRef names objects of the Telemetry's own namespace only, and the
// GatewayClass counts only from the root namespace. A Service targetRef to
// the tenant's own service bound to the shared waypoint changes that
// service's requests only.
func TestTelemetryTenantIsolation(t *testing.T) {
	cfg := telemetryConfig(t)
	const base = `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: mesh-default, namespace: istio-system}
spec:
  accessLogging: [{providers: [{name: stdout}]}]
  tracing: [{providers: [{name: otel-tracing}], randomSamplingPercentage: 10}]
`
	const grab = `
apiVersion: v1
kind: Service
metadata:
  name: grab
  namespace: evil
  labels: {istio.io/use-waypoint: waypoint, istio.io/use-waypoint-namespace: shop}
spec: {selector: {app: grab}, clusterIP: 10.96.0.20, ports: [{name: http, port: 80}]}
`
	clean, _ := telemetryConfigs(t, cfg, base)
	want := clean["shop/waypoint"].GetTelemetry()
	attack := `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: ns-wide, namespace: evil}
spec:
  accessLogging: [{disabled: true}, {providers: [{name: otel-logs}]}]
  metrics: [{overrides: [{match: {metric: ALL_METRICS}, disabled: true}]}]
  tracing: [{randomSamplingPercentage: 100, disableSpanReporting: true}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: other-gateway, namespace: evil}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint, namespace: shop}]
  accessLogging: [{providers: [{name: stdout}], disabled: true}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: same-name-gateway, namespace: evil}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  tracing: [{randomSamplingPercentage: 0}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: class, namespace: evil}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: GatewayClass, name: istio-waypoint}]
  metrics: [{overrides: [{match: {metric: ALL_METRICS}, disabled: true}]}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: their-service, namespace: evil}
spec:
  targetRefs: [{kind: Service, name: cart, namespace: shop}, {kind: Service, name: cart}]
  metrics: [{overrides: [{match: {metric: ALL_METRICS}, disabled: true}]}]
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: own-service, namespace: evil}
spec:
  targetRefs: [{kind: Service, name: grab}]
  tracing: [{randomSamplingPercentage: 100}]
`
	objs := tenantObjects(t, base+"---\n"+attack+"---\n"+grab)
	// The shop waypoint accepts the tenant's service (allowedRoutes All),
	// the setting under which a waypoint is shared.
	from := gatewayv1.NamespacesFromAll
	for _, gw := range objs.Gateways {
		gw.Spec.Listeners[0].AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &from}}
	}
	res := Translate(cfg, objs, nil)
	wps, statuses := WaypointConfigs(cfg, objs, res)
	c := wps["shop/waypoint"]
	if got := c.GetTelemetry(); !proto.Equal(got, want) {
		t.Errorf("shop/waypoint telemetry changed by the tenant:\n got %v\nwant %v", got, want)
	}
	if s := serviceOf(c, "cart"); s == nil || s.GetTelemetry() != nil {
		t.Errorf("shop/cart telemetry = %v, want none (waypoint-wide)", s.GetTelemetry())
	}
	g := serviceOf(c, "grab")
	if g == nil {
		t.Fatal("evil/grab is not bound to shop/waypoint")
	}
	if got := g.GetTelemetry().GetTracing().GetRandomSamplingPercentage(); got != 100 {
		t.Errorf("evil/grab sampling = %v, want 100 (its own Service targetRef)", got)
	}
	if got := g.GetTelemetry().GetAccessLogging(); !proto.Equal(got, want.GetAccessLogging()) {
		t.Errorf("evil/grab access log = %v, want the waypoint's", got)
	}
	for _, s := range statuses {
		if s.Kind != kindTelemetry || !strings.HasPrefix(s.Name, "evil/") {
			continue
		}
		if s.Name == "evil/own-service" {
			if !s.Sent || !strings.Contains(s.Message, "grab.evil.svc.cluster.local") {
				t.Errorf("%s: %+v", s.Name, s)
			}
			continue
		}
		if s.Sent || !strings.HasPrefix(s.Message, "not applied") {
			t.Errorf("%s: %+v, want not applied", s.Name, s)
		}
	}
}

// TestTelemetryServiceTarget: a Telemetry of the service's namespace that
// names it applies to its requests only, merged over the waypoint's.
func TestTelemetryServiceTarget(t *testing.T) {
	cfg := telemetryConfig(t)
	wps, st := telemetryConfigs(t, cfg, `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: cart, namespace: shop}
spec:
  targetRef: {kind: Service, name: cart}
  accessLogging: [{providers: [{name: otel-logs}], filter: {expression: "response.code >= 500 && request.method == 'GET'"}}]
  tracing: [{providers: [{name: otel-grpc}], disableSpanReporting: true}]
`)
	c := wps["shop/waypoint"]
	if c.GetTelemetry().GetAccessLogging() != nil || c.GetTelemetry().GetTracing() != nil {
		t.Errorf("waypoint-wide telemetry = %v, want no access log and no tracing", c.GetTelemetry())
	}
	ct := serviceOf(c, "cart").GetTelemetry()
	if p := ct.GetAccessLogging().GetProviders(); len(p) != 1 || p[0].GetOtel().GetPort() != 4317 {
		t.Errorf("cart access log = %v", ct.GetAccessLogging())
	}
	if f := ct.GetAccessLogging().GetFilter(); len(f) != 2 || f[0].GetAttribute() != waypointapi.Attribute_RESPONSE_CODE ||
		f[0].GetOp() != waypointapi.LogCondition_GE || f[0].GetValue() != "500" || f[1].GetValue() != "GET" {
		t.Errorf("cart filter = %v", f)
	}
	if tr := ct.GetTracing(); tr.GetProvider().GetName() != "otel-grpc" || !tr.GetDisableSpanReporting() || tr.GetRandomSamplingPercentage() != 5 {
		t.Errorf("cart tracing = %v (sampling: meshConfig's default)", tr)
	}
	if s := st["shop/cart"]; !s.Sent || !strings.Contains(s.Message, "for cart.shop.svc.cluster.local") {
		t.Errorf("status = %+v", s)
	}
}

// TestTelemetryRefused: what cannot be enforced is named in the status.
func TestTelemetryRefused(t *testing.T) {
	cfg := telemetryConfig(t)
	_, st := telemetryConfigs(t, cfg, `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: bad, namespace: shop}
spec:
  accessLogging:
  - providers: [{name: nope}, {name: zipkin}]
  - providers: [{name: stdout}]
    filter: {expression: "response.code >= 400 || request.method == 'POST'"}
  metrics:
  - providers: [{name: stdout}]
    reportingInterval: 10s
    overrides:
    - match: {customMetric: my_metric}
      disabled: true
    - match: {metric: GRPC_REQUEST_MESSAGES}
      disabled: true
  tracing:
  - providers: [{name: zipkin}]
    randomSamplingPercentage: 150
    customTags: {f: {formatter: {value: "%REQ(x)%"}}}
    enableIstioTags: true
    disableContextPropagation: true
`)
	s := st["shop/bad"]
	for _, want := range []string{
		`spec.accessLogging[0].providers: "nope" is not a meshConfig extensionProvider`,
		`spec.accessLogging[0].providers: "zipkin" is not an access log provider`,
		`spec.accessLogging[1].filter.expression:`,
		`spec.metrics[0].reportingInterval:`,
		`spec.metrics[0].providers: "stdout" is not a prometheus provider`,
		`spec.metrics[0].overrides[0].match.customMetric:`,
		`spec.metrics[0].overrides[1].match.metric: GRPC_REQUEST_MESSAGES`,
		`spec.tracing[0].providers: "zipkin"`,
		`spec.tracing[0].randomSamplingPercentage: 150`,
		`spec.tracing[0].customTags[f].formatter:`,
		`spec.tracing[0].enableIstioTags:`,
		`spec.tracing[0].disableContextPropagation:`,
	} {
		if !slices.ContainsFunc(s.Invalid, func(i string) bool { return strings.HasPrefix(i, want) }) {
			t.Errorf("status invalid %q lacks %q", s.Invalid, want)
		}
	}
}

func TestParseTelemetryExpressions(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want *waypointapi.TagValue
	}{
		{"request.host", &waypointapi.TagValue{Attribute: waypointapi.Attribute_REQUEST_HOST}},
		{"request.method", &waypointapi.TagValue{Attribute: waypointapi.Attribute_REQUEST_METHOD}},
		{"response.code", &waypointapi.TagValue{Attribute: waypointapi.Attribute_RESPONSE_CODE}},
		{`request.headers["X-Foo"]`, &waypointapi.TagValue{Attribute: waypointapi.Attribute_REQUEST_HEADER, Header: "x-foo"}},
		{"'literal'", &waypointapi.TagValue{Literal: "literal"}},
		{`"lit"`, &waypointapi.TagValue{Literal: "lit"}},
		{"response.duration", nil},
		{"upstream_peer.labels['app'].value", nil},
		{"request.headers['a'] + 'b'", nil},
		{"xds.node.metadata", nil},
	} {
		got, err := ParseTagValue(tc.expr)
		if tc.want == nil {
			if err == nil {
				t.Errorf("ParseTagValue(%q) = %v, want refused", tc.expr, got)
			}
			continue
		}
		tc.want.Expression = tc.expr
		if err != nil || !proto.Equal(got, tc.want) {
			t.Errorf("ParseTagValue(%q) = %v, %v; want %v", tc.expr, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		expr string
		n    int
	}{
		{"response.code >= 400", 1},
		{"response.code != 200 && request.headers['x-debug'] == 'true'", 2},
		{"response.duration > 100", 1},
		{"response.code >= 400 || response.code == 0", 0},
		{"request.method > 'GET'", 0},
		{"response.code >= 'x'", 0},
		{"has(request.headers['x'])", 0},
	} {
		got, err := ParseLogFilter(tc.expr)
		if (err == nil) != (tc.n > 0) || len(got) != tc.n {
			t.Errorf("ParseLogFilter(%q) = %v, %v; want %d conditions", tc.expr, got, err, tc.n)
		}
	}
}

// TestTelemetryChangeRebuildsWaypoints: a Telemetry change alone makes the
// incremental translator say the waypoint configs must be rebuilt.
func TestTelemetryChangeRebuildsWaypoints(t *testing.T) {
	cfg := telemetryConfig(t)
	before := tenantObjects(t, "")
	after := tenantObjects(t, `
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: ns, namespace: shop}
spec: {tracing: [{randomSamplingPercentage: 30}]}
`)
	tr := NewTranslator(cfg)
	tr.Update(before, nil)
	_, ch := tr.Update(after, nil)
	if !ch.Routes && !ch.Full {
		t.Fatalf("change = %+v, want the waypoint configs rebuilt", ch)
	}
	wps, _ := WaypointConfigs(cfg, after, tr.Result())
	if got := wps["shop/waypoint"].GetTelemetry().GetTracing().GetRandomSamplingPercentage(); got != 30 {
		t.Errorf("sampling = %v, want 30", got)
	}
}
