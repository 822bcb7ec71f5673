package translate

import (
	"fmt"
	"strings"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// TelemetryMesh is the part of meshConfig the Telemetry API resolves
// against: extensionProviders by name and defaultProviders.
type TelemetryMesh struct {
	// Providers are meshConfig.extensionProviders by name.
	Providers map[string]*TelemetryProvider
	// DefaultAccessLogging, DefaultTracing and DefaultMetrics are
	// defaultProviders: what applies where no Telemetry names providers.
	DefaultAccessLogging, DefaultTracing, DefaultMetrics []string
	// DefaultSampling is meshConfig defaultConfig.tracing.sampling (0..100);
	// 0 means Istio's default of 1 %.
	DefaultSampling float64
}

// TelemetryProvider is one extensionProvider: one of its kinds is set, or
// Unsupported names its kind.
type TelemetryProvider struct {
	Name    string
	FileLog *waypointapi.FileAccessLog
	OtelLog *waypointapi.OtelAccessLog
	Tracing *waypointapi.TracingProvider
	// Prometheus: the metrics provider (the proxies' /metrics).
	Prometheus bool
	// Unsupported is the kind of a provider this mesh does not implement.
	Unsupported string
}

// MeshTelemetry converts meshConfig's extensionProviders and
// defaultProviders. Problems (a provider kind not implemented, a labels
// value that is not a string) are returned, each "<provider>: <why>"; the
// provider is then kept as Unsupported so a Telemetry naming it says so.
func MeshTelemetry(mc *meshv1alpha1.MeshConfig) (TelemetryMesh, []string) {
	tm := TelemetryMesh{Providers: map[string]*TelemetryProvider{}}
	var problems []string
	for _, ep := range mc.GetExtensionProviders() {
		p := &TelemetryProvider{Name: ep.GetName()}
		switch {
		case ep.GetEnvoyFileAccessLog() != nil:
			f := ep.GetEnvoyFileAccessLog()
			lf, err := fileLogFormat(f.GetLogFormat())
			if err != nil {
				p.Unsupported = "envoyFileAccessLog (" + err.Error() + ")"
				break
			}
			p.FileLog = &waypointapi.FileAccessLog{Path: f.GetPath(), Format: lf}
			if p.FileLog.Path == "" {
				p.FileLog.Path = "/dev/stdout"
			}
		case ep.GetEnvoyOtelAls() != nil:
			o := ep.GetEnvoyOtelAls()
			lf, err := otelLogFormat(o.GetLogFormat())
			if err != nil {
				p.Unsupported = "envoyOtelAls (" + err.Error() + ")"
				break
			}
			p.OtelLog = &waypointapi.OtelAccessLog{Service: o.GetService(), Port: o.GetPort(), LogName: o.GetLogName(), Format: lf}
			if p.OtelLog.LogName == "" {
				p.OtelLog.LogName = "otel_envoy_accesslog"
			}
		case ep.GetOpentelemetry() != nil:
			o := ep.GetOpentelemetry()
			tp := &waypointapi.TracingProvider{Name: ep.GetName(), Service: o.GetService(), Port: o.GetPort(), MaxTagLength: o.GetMaxTagLength()}
			headers := o.GetGrpc().GetInitialMetadata()
			if h := o.GetHttp(); h != nil {
				tp.Protocol = waypointapi.TracingProvider_HTTP
				tp.HttpPath = h.GetPath()
				if tp.HttpPath == "" {
					tp.HttpPath = "/v1/traces"
				}
				tp.TimeoutMs = uint32(h.GetTimeout().AsDuration().Milliseconds())
				headers = h.GetHeaders()
			} else if g := o.GetGrpc(); g != nil {
				tp.TimeoutMs = uint32(g.GetTimeout().AsDuration().Milliseconds())
			}
			for _, h := range headers {
				if h.GetEnvName() != "" {
					problems = append(problems, ep.GetName()+": header "+h.GetName()+" from envName is not supported (dropped)")
					continue
				}
				if tp.Headers == nil {
					tp.Headers = map[string]string{}
				}
				tp.Headers[h.GetName()] = h.GetValue()
			}
			if o.GetResourceDetectors() != nil || o.GetDynatraceSampler() != nil || o.GetSampling() != nil {
				problems = append(problems, ep.GetName()+": resourceDetectors and samplers are not supported (ignored)")
			}
			p.Tracing = tp
		case ep.GetPrometheus() != nil:
			p.Prometheus = true
		default:
			p.Unsupported = providerKind(ep)
		}
		if p.Unsupported != "" {
			problems = append(problems, ep.GetName()+": provider "+p.Unsupported+" is not supported")
		}
		tm.Providers[p.Name] = p
	}
	dp := mc.GetDefaultProviders()
	tm.DefaultAccessLogging = dp.GetAccessLogging()
	tm.DefaultTracing = dp.GetTracing()
	tm.DefaultMetrics = dp.GetMetrics()
	tm.DefaultSampling = mc.GetDefaultConfig().GetTracing().GetSampling()
	return tm, problems
}

// providerKind names the oneof an extensionProvider sets, as meshConfig
// spells it.
func providerKind(ep *meshv1alpha1.MeshConfig_ExtensionProvider) string {
	if ep.GetProvider() == nil {
		return "(none)"
	}
	n := fmt.Sprintf("%T", ep.GetProvider()) // *v1alpha1.MeshConfig_ExtensionProvider_Zipkin
	n = n[strings.LastIndex(n, "_")+1:]
	return strings.ToLower(n[:1]) + n[1:]
}

type logFormat interface {
	GetText() string
}

func fileLogFormat(f *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyFileAccessLogProvider_LogFormat) (*waypointapi.LogFormat, error) {
	if f == nil {
		return nil, nil
	}
	return convertLogFormat(f, f.GetLabels().AsMap())
}

func otelLogFormat(f *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyOpenTelemetryLogProvider_LogFormat) (*waypointapi.LogFormat, error) {
	if f == nil {
		return nil, nil
	}
	return convertLogFormat(f, f.GetLabels().AsMap())
}

func convertLogFormat(f logFormat, labels map[string]any) (*waypointapi.LogFormat, error) {
	lf := &waypointapi.LogFormat{Text: f.GetText()}
	for k, v := range labels {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("logFormat.labels.%s: only string values are supported", k)
		}
		if lf.Labels == nil {
			lf.Labels = map[string]string{}
		}
		lf.Labels[k] = s
	}
	return lf, nil
}
