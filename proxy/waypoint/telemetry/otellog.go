package telemetry

import (
	"context"
	"net"
	"strconv"
	"time"

	otelattr "go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// otelExport is one OTLP/gRPC log exporter (envoyOtelAls), shared by every
// config that names the same collector and logger name: records are
// batched and sent in the background (the SDK's batch processor), so the
// request path only renders and queues.
type otelExport struct {
	provider *sdklog.LoggerProvider
	logger   otellog.Logger
}

// otelKey names one exporter.
func otelKey(o *waypointapi.OtelAccessLog) string {
	return net.JoinHostPort(o.GetService(), strconv.Itoa(int(o.GetPort()))) + "|" + o.GetLogName()
}

// otelFor returns the exporter of o, creating it once. The connection is
// made lazily by gRPC: an unreachable collector drops records (and the
// SDK reports it), it never blocks a request.
func (rec *Recorder) otelFor(o *waypointapi.OtelAccessLog) (*otelExport, error) {
	key := otelKey(o)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if e := rec.otel[key]; e != nil {
		return e, nil
	}
	exp, err := otlploggrpc.New(context.Background(),
		otlploggrpc.WithEndpoint(net.JoinHostPort(o.GetService(), strconv.Itoa(int(o.GetPort())))),
		otlploggrpc.WithInsecure(), otlploggrpc.WithTimeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	p := sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(exp,
		sdklog.WithExportInterval(time.Second))))
	e := &otelExport{provider: p, logger: p.Logger(o.GetLogName())}
	rec.otel[key] = e
	return e, nil
}

// emit sends one record: the body is the formatted text (Istio's default
// format unless logFormat.text), the labels are attributes.
func (s *logSink) emitOTel(ex *Entry, proto, flags string) {
	var r otellog.Record
	now := time.Now()
	r.SetTimestamp(now)
	r.SetObservedTimestamp(now)
	r.SetSeverity(otellog.SeverityInfo)
	r.SetBody(otelattr.StringValue(string(render(nil, s.text, ex, proto, flags))))
	for _, l := range s.labels {
		r.AddAttributes(otelattr.String(l.key, string(render(nil, l.fmt, ex, proto, flags))))
	}
	s.otel.logger.Emit(context.Background(), r)
}

// Close flushes and stops the OTLP exporters (the waypoint's shutdown).
func (rec *Recorder) Close(ctx context.Context) {
	rec.mu.Lock()
	exps := rec.otel
	rec.otel = map[string]*otelExport{}
	rec.mu.Unlock()
	for _, e := range exps {
		_ = e.provider.Shutdown(ctx)
	}
}
