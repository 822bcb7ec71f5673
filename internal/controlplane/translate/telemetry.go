package translate

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	telemetryapi "istio.io/api/telemetry/v1alpha1"
	telemetryv1 "istio.io/client-go/pkg/apis/telemetry/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

const (
	kindTelemetry = "Telemetry"
	gatewayGroup  = "gateway.networking.k8s.io"
)

// telemetryState is what became of each Telemetry, for its status.
type telemetryState struct {
	waypoints []string // "ns/name" of waypoints it applies to
	services  []string // hostnames it applies to (Service targetRefs)
	invalid   []string // "<field>: <why>"
	notes     []string
}

// telemetries resolves the Telemetry API for the waypoints.
type telemetries struct {
	root  string
	mesh  TelemetryMesh
	objs  []*telemetryv1.Telemetry
	state map[string]*telemetryState // ns/name
}

func newTelemetries(cfg Config, objs []*telemetryv1.Telemetry) *telemetries {
	ts := &telemetries{root: cfg.RootNamespace, mesh: cfg.Telemetry, state: map[string]*telemetryState{}}
	ts.objs = slices.Clone(objs)
	// Istio applies the oldest first where several apply at one level; a
	// later one overrides what it sets.
	sort.SliceStable(ts.objs, func(i, j int) bool {
		a, b := ts.objs[i], ts.objs[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	for _, t := range ts.objs {
		ts.state[t.Namespace+"/"+t.Name] = &telemetryState{}
	}
	return ts
}

func telemetryTargetRefs(t *telemetryv1.Telemetry) []*targetRef {
	var out []*targetRef
	if r := t.Spec.GetTargetRef(); r != nil {
		out = append(out, &targetRef{r.GetGroup(), r.GetKind(), r.GetName(), r.GetNamespace()})
	}
	for _, r := range t.Spec.GetTargetRefs() {
		out = append(out, &targetRef{r.GetGroup(), r.GetKind(), r.GetName(), r.GetNamespace()})
	}
	return out
}

// forWaypoint returns the merged Telemetry of waypoint ns/name (nil when
// nothing applies and no default provider is set), and the merge before
// the Service targetRefs, which forService builds on.
func (ts *telemetries) forWaypoint(ns, name string) (*waypointapi.Telemetry, *telemetryMerge) {
	m := ts.newMerge()
	var levels [3][]*telemetryv1.Telemetry
	for _, t := range ts.objs {
		refs := telemetryTargetRefs(t)
		switch {
		case len(refs) == 0 && t.Spec.GetSelector() != nil:
			// Waypoints never use selector (Istio's policy attachment).
		case len(refs) == 0 && t.Namespace == ts.root:
			levels[0] = append(levels[0], t)
		case len(refs) == 0 && t.Namespace == ns:
			levels[1] = append(levels[1], t)
		case len(refs) > 0:
			for _, r := range refs {
				if r.group == gatewayGroup && r.kind == "Gateway" && r.name == name && t.Namespace == ns && (r.namespace == "" || r.namespace == ns) ||
					r.group == gatewayGroup && r.kind == "GatewayClass" && r.name == WaypointClass && t.Namespace == ts.root {
					levels[2] = append(levels[2], t)
					break
				}
			}
		}
	}
	for _, lv := range levels {
		for _, t := range lv {
			m.apply(t)
			st := ts.state[t.Namespace+"/"+t.Name]
			st.waypoints = append(st.waypoints, ns+"/"+name)
		}
	}
	return m.result(name + "." + ns), m
}

// forService returns the Telemetry of the requests for one bound service
// when a Telemetry in its namespace names it by targetRefs (kind Service
// for a Kubernetes Service, ServiceEntry for a ServiceEntry), else nil.
func (ts *telemetries) forService(base *telemetryMerge, waypointKey, serviceName string, svc *waypointapi.Service) *waypointapi.Telemetry {
	var applied bool
	m := base.clone()
	for _, t := range ts.objs {
		if t.Namespace != svc.Namespace {
			continue
		}
		for _, r := range telemetryTargetRefs(t) {
			if r.name == svc.Name && (r.namespace == "" || r.namespace == t.Namespace) &&
				(svc.Kind == "Service" && r.group == "" && r.kind == "Service" ||
					svc.Kind == "ServiceEntry" && r.group == "networking.istio.io" && r.kind == "ServiceEntry") {
				m.apply(t)
				applied = true
				st := ts.state[t.Namespace+"/"+t.Name]
				if !slices.Contains(st.waypoints, waypointKey) {
					st.waypoints = append(st.waypoints, waypointKey)
				}
				st.services = append(st.services, svc.Hostname)
				break
			}
		}
	}
	if !applied {
		return nil
	}
	return m.result(serviceName)
}

// statuses reports every Telemetry.
func (ts *telemetries) statuses() []PolicyStatus {
	var out []PolicyStatus
	for _, t := range ts.objs {
		key := t.Namespace + "/" + t.Name
		st := ts.state[key]
		ps := PolicyStatus{Kind: kindTelemetry, Name: key, Sent: len(st.waypoints) > 0, Invalid: dedupe(st.invalid)}
		switch {
		case len(st.waypoints) > 0:
			wps := dedupe(st.waypoints)
			sort.Strings(wps)
			ps.Message = EnforcedByWaypoint + strings.Join(wps, ", ")
			if len(st.services) > 0 {
				svcs := dedupe(st.services)
				sort.Strings(svcs)
				ps.Message += " for " + strings.Join(svcs, ", ")
			}
		case t.Spec.GetSelector() != nil && len(telemetryTargetRefs(t)) == 0:
			ps.Message = "not applied: selector selects no waypoint (waypoints take Telemetry by targetRefs, as in Istio); node proxies do not read the Telemetry API"
		default:
			ps.Message = "not applied: no waypoint of this namespace or target exists; node proxies do not read the Telemetry API"
		}
		if notes := dedupe(st.notes); len(notes) > 0 {
			ps.Message += "; " + strings.Join(notes, "; ")
		}
		if len(ps.Invalid) > 0 {
			ps.Message += "; not enforced: " + strings.Join(ps.Invalid, "; ")
		}
		out = append(out, ps)
	}
	return out
}

// telemetryMerge accumulates the levels, least specific first.
type telemetryMerge struct {
	ts      *telemetries
	sources []string

	// logs: provider name → enabled, with the filter of the entry that
	// enabled it.
	logs      map[string]*logState
	logsOrder []string

	// metrics: per Istio metric (1..8), the state after every override.
	metrics  map[waypointapi.Metric]*metricState
	promOff  bool // a metrics entry named providers without prometheus
	tracing  tracingState
	anyTrace bool
}

type logState struct {
	enabled bool
	filter  []*waypointapi.LogCondition
	expr    string
}

type metricState struct {
	disabled bool
	tags     []*waypointapi.TagOverride
	touched  bool
}

type tracingState struct {
	providers []string
	sampling  *float64
	disable   bool
	reqID     *bool
	tags      map[string]*waypointapi.CustomTag
}

func (ts *telemetries) newMerge() *telemetryMerge {
	m := &telemetryMerge{ts: ts, logs: map[string]*logState{}, metrics: map[waypointapi.Metric]*metricState{}}
	for _, p := range ts.mesh.DefaultAccessLogging {
		m.setLog(p, &logState{enabled: true})
	}
	return m
}

func (m *telemetryMerge) clone() *telemetryMerge {
	c := &telemetryMerge{ts: m.ts, sources: slices.Clone(m.sources), logs: map[string]*logState{},
		logsOrder: slices.Clone(m.logsOrder), metrics: map[waypointapi.Metric]*metricState{},
		promOff: m.promOff, tracing: m.tracing, anyTrace: m.anyTrace}
	for k, v := range m.logs {
		vv := *v
		c.logs[k] = &vv
	}
	for k, v := range m.metrics {
		vv := *v
		vv.tags = slices.Clone(v.tags)
		c.metrics[k] = &vv
	}
	c.tracing.providers = slices.Clone(m.tracing.providers)
	if m.tracing.tags != nil {
		c.tracing.tags = map[string]*waypointapi.CustomTag{}
		for k, v := range m.tracing.tags {
			c.tracing.tags[k] = v
		}
	}
	return c
}

func (m *telemetryMerge) setLog(name string, st *logState) {
	if _, ok := m.logs[name]; !ok {
		m.logsOrder = append(m.logsOrder, name)
	}
	m.logs[name] = st
}

// modeAtWaypoint: a waypoint is the server side of the requests it
// handles (Istio configures its telemetry as an inbound listener's), so
// CLIENT_AND_SERVER and SERVER selectors apply, CLIENT does not.
func modeAtWaypoint(mode telemetryapi.WorkloadMode) bool {
	return mode != telemetryapi.WorkloadMode_CLIENT
}

func (m *telemetryMerge) apply(t *telemetryv1.Telemetry) {
	key := t.Namespace + "/" + t.Name
	st := m.ts.state[key]
	m.sources = append(m.sources, key)
	bad := func(format string, args ...any) { st.invalid = append(st.invalid, fmt.Sprintf(format, args...)) }
	spec := &t.Spec

	for i, al := range spec.GetAccessLogging() {
		if !modeAtWaypoint(al.GetMatch().GetMode()) {
			continue
		}
		field := fmt.Sprintf("spec.accessLogging[%d]", i)
		var filter []*waypointapi.LogCondition
		expr := al.GetFilter().GetExpression()
		if expr != "" {
			f, err := ParseLogFilter(expr)
			if err != nil {
				bad("%s.filter.expression: %v (the entry is not applied)", field, err)
				continue
			}
			filter = f
		}
		names := refNames(al.GetProviders())
		if len(names) == 0 {
			names = m.ts.mesh.DefaultAccessLogging
		}
		for _, n := range names {
			p := m.ts.mesh.Providers[n]
			switch {
			case p == nil:
				bad("%s.providers: %q is not a meshConfig extensionProvider", field, n)
				continue
			case p.FileLog == nil && p.OtelLog == nil:
				bad("%s.providers: %q is not an access log provider this mesh implements (envoyFileAccessLog, envoyOtelAls)", field, n)
				continue
			}
			m.setLog(n, &logState{enabled: !al.GetDisabled().GetValue(), filter: filter, expr: expr})
		}
	}

	for i, mt := range spec.GetMetrics() {
		field := fmt.Sprintf("spec.metrics[%d]", i)
		if mt.GetReportingInterval() != nil {
			bad("%s.reportingInterval: Prometheus scrapes the proxies; there is no push interval (ignored)", field)
		}
		if names := refNames(mt.GetProviders()); len(names) > 0 {
			prom := false
			for _, n := range names {
				if p := m.ts.mesh.Providers[n]; p != nil && p.Prometheus {
					prom = true
				} else {
					bad("%s.providers: %q is not a prometheus provider (only prometheus metrics are implemented)", field, n)
				}
			}
			m.promOff = !prom
		}
		for j, o := range mt.GetOverrides() {
			of := fmt.Sprintf("%s.overrides[%d]", field, j)
			if !modeAtWaypoint(o.GetMatch().GetMode()) {
				continue
			}
			if o.GetMatch().GetCustomMetric() != "" {
				bad("%s.match.customMetric: custom metrics are not implemented (the override is not applied)", of)
				continue
			}
			metric := o.GetMatch().GetMetric()
			targets := []waypointapi.Metric{waypointapi.Metric(metric)}
			switch {
			case metric == telemetryapi.MetricSelector_ALL_METRICS:
				targets = targets[:0]
				for v := waypointapi.Metric_REQUEST_COUNT; v <= waypointapi.Metric_TCP_RECEIVED_BYTES; v++ {
					targets = append(targets, v)
				}
			case metric == telemetryapi.MetricSelector_GRPC_REQUEST_MESSAGES || metric == telemetryapi.MetricSelector_GRPC_RESPONSE_MESSAGES:
				bad("%s.match.metric: %s is not emitted by the waypoint (nothing to override)", of, metric)
				continue
			}
			var tags []*waypointapi.TagOverride
			ok := true
			for _, name := range sortedKeys(o.GetTagOverrides()) {
				to := o.GetTagOverrides()[name]
				if !slices.Contains(istioMetricLabels, name) {
					bad("%s.tagOverrides.%s: only Istio's standard labels can be changed or removed; adding a label is not implemented (the override is not applied)", of, name)
					ok = false
					continue
				}
				if to.GetOperation() == telemetryapi.MetricsOverrides_TagOverride_REMOVE {
					tags = append(tags, &waypointapi.TagOverride{Name: name, Remove: true})
					continue
				}
				v, err := ParseTagValue(to.GetValue())
				if err != nil {
					bad("%s.tagOverrides.%s.value: %v (the override is not applied)", of, name, err)
					ok = false
					continue
				}
				tags = append(tags, &waypointapi.TagOverride{Name: name, Value: v})
			}
			if !ok {
				continue
			}
			for _, tm := range targets {
				ms := m.metrics[tm]
				if ms == nil {
					ms = &metricState{}
					m.metrics[tm] = ms
				}
				ms.touched = true
				if d := o.GetDisabled(); d != nil {
					ms.disabled = d.GetValue()
				}
				ms.tags = append(ms.tags, tags...)
			}
		}
	}

	for i, tr := range spec.GetTracing() {
		if !modeAtWaypoint(tr.GetMatch().GetMode()) {
			continue
		}
		field := fmt.Sprintf("spec.tracing[%d]", i)
		m.anyTrace = true
		if names := refNames(tr.GetProviders()); len(names) > 0 {
			var ok []string
			for _, n := range names {
				if p := m.ts.mesh.Providers[n]; p == nil || p.Tracing == nil {
					bad("%s.providers: %q is not an opentelemetry tracing provider of meshConfig", field, n)
				} else {
					ok = append(ok, n)
				}
			}
			if len(ok) > 1 {
				bad("%s.providers: only one tracing provider is supported (as in Istio); using %q", field, ok[0])
			}
			if len(ok) > 0 {
				m.tracing.providers = ok[:1]
			}
		}
		if s := tr.GetRandomSamplingPercentage(); s != nil {
			v := s.GetValue()
			if v < 0 || v > 100 {
				bad("%s.randomSamplingPercentage: %v is outside 0..100 (ignored)", field, v)
			} else {
				m.tracing.sampling = &v
			}
		}
		if d := tr.GetDisableSpanReporting(); d != nil {
			m.tracing.disable = d.GetValue()
		}
		if r := tr.GetUseRequestIdForTraceSampling(); r != nil {
			v := r.GetValue()
			m.tracing.reqID = &v
		}
		if tr.GetEnableIstioTags() != nil {
			bad("%s.enableIstioTags: not implemented (ignored)", field)
		}
		if tr.GetDisableContextPropagation() != nil {
			bad("%s.disableContextPropagation: not implemented (ignored)", field)
		}
		for _, name := range sortedKeys(tr.GetCustomTags()) {
			ct := tr.GetCustomTags()[name]
			tag := &waypointapi.CustomTag{Name: name}
			switch {
			case ct.GetLiteral() != nil:
				tag.Type = &waypointapi.CustomTag_Literal{Literal: ct.GetLiteral().GetValue()}
			case ct.GetHeader() != nil:
				tag.Type = &waypointapi.CustomTag_Header{Header: strings.ToLower(ct.GetHeader().GetName())}
				tag.DefaultValue = ct.GetHeader().GetDefaultValue()
			case ct.GetEnvironment() != nil:
				tag.Type = &waypointapi.CustomTag_Environment{Environment: ct.GetEnvironment().GetName()}
				tag.DefaultValue = ct.GetEnvironment().GetDefaultValue()
			case ct.GetFormatter() != nil:
				bad("%s.customTags[%s].formatter: only literal, header and environment tags are implemented (ignored)", field, name)
				continue
			default:
				bad("%s.customTags[%s]: no tag type set (ignored)", field, name)
				continue
			}
			if m.tracing.tags == nil {
				m.tracing.tags = map[string]*waypointapi.CustomTag{}
			}
			m.tracing.tags[name] = tag
		}
	}
}

func refNames(refs []*telemetryapi.ProviderRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.GetName())
	}
	return out
}

// result builds the wire message; nil when nothing is configured.
func (m *telemetryMerge) result(serviceName string) *waypointapi.Telemetry {
	out := &waypointapi.Telemetry{Sources: m.sources}
	var set bool
	al := &waypointapi.AccessLogging{}
	var filterSet bool
	for _, n := range m.logsOrder {
		st := m.logs[n]
		p := m.ts.mesh.Providers[n]
		if !st.enabled || p == nil || p.FileLog == nil && p.OtelLog == nil {
			continue
		}
		ap := &waypointapi.AccessLogProvider{Name: n}
		if p.FileLog != nil {
			ap.Kind = &waypointapi.AccessLogProvider_File{File: p.FileLog}
		} else {
			ap.Kind = &waypointapi.AccessLogProvider_Otel{Otel: p.OtelLog}
		}
		al.Providers = append(al.Providers, ap)
		// One filter for every provider: the first enabled provider's
		// (differing filters per provider are reported below).
		if !filterSet {
			al.Filter, al.FilterExpression, filterSet = st.filter, st.expr, true
		} else if st.expr != al.FilterExpression {
			for _, s := range m.sources {
				if ts := m.ts.state[s]; ts != nil {
					ts.notes = append(ts.notes, "access log providers with different filters: the filter of "+al.Providers[0].Name+" applies to all")
				}
			}
		}
	}
	if len(al.Providers) > 0 {
		out.AccessLogging = al
		set = true
	}
	for v := waypointapi.Metric_REQUEST_COUNT; v <= waypointapi.Metric_TCP_RECEIVED_BYTES; v++ {
		ms := m.metrics[v]
		if m.promOff {
			out.MetricOverrides = append(out.MetricOverrides, &waypointapi.MetricOverride{Metric: v, Disabled: true})
			continue
		}
		if ms == nil || !ms.touched || !ms.disabled && len(ms.tags) == 0 {
			continue
		}
		out.MetricOverrides = append(out.MetricOverrides, &waypointapi.MetricOverride{Metric: v, Disabled: ms.disabled, Tags: ms.tags})
	}
	if len(out.MetricOverrides) > 0 {
		set = true
	}
	providers := m.tracing.providers
	if providers == nil {
		for _, n := range m.ts.mesh.DefaultTracing {
			if p := m.ts.mesh.Providers[n]; p != nil && p.Tracing != nil {
				providers = []string{n}
				break
			}
		}
	}
	if len(providers) > 0 || m.anyTrace {
		tr := &waypointapi.Tracing{
			RandomSamplingPercentage: m.ts.mesh.DefaultSampling, DisableSpanReporting: m.tracing.disable,
			ServiceName: serviceName, UseRequestIdForTraceSampling: true,
		}
		if tr.RandomSamplingPercentage == 0 {
			tr.RandomSamplingPercentage = 1
		}
		if m.tracing.sampling != nil {
			tr.RandomSamplingPercentage = *m.tracing.sampling
		}
		if m.tracing.reqID != nil {
			tr.UseRequestIdForTraceSampling = *m.tracing.reqID
		}
		if len(providers) > 0 {
			tr.Provider = m.ts.mesh.Providers[providers[0]].Tracing
		}
		for _, n := range sortedKeys(m.tracing.tags) {
			tr.CustomTags = append(tr.CustomTags, m.tracing.tags[n])
		}
		out.Tracing = tr
		set = true
	}
	if !set && len(m.sources) == 0 {
		return nil
	}
	return out
}
