package proxy

import (
	"io"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// lifecycle is one connection's record from accept to close, as the
// outbound path fills it in.
func lifecycle(m *Metrics, log *zap.Logger, src, dst identity.Identity) {
	r := NewResult(m, log, Outbound, netip.MustParseAddrPort("10.0.0.1:40000"), netip.MustParseAddrPort("10.0.1.2:15008"))
	r.Src = Peer{Workload: "client", Namespace: "apps", Identity: src}
	r.Dst = Peer{Workload: "server", Namespace: "apps", Identity: dst}
	r.Service = Service{Hostname: "server.apps.svc.cluster.local", Namespace: "apps", Name: "server"}
	r.HBONEAddr = netip.MustParseAddrPort("10.0.1.2:8080")
	r.MTLS = true
	r.Opened()
	r.Counters.Sent.Add(100)
	r.Counters.Received.Add(7)
	r.Record(nil)
}

func jsonLogger(l zapcore.Level) *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), l))
}

// BenchmarkResultLifecycle is the metrics and access-log cost of one
// connection, with the access log off (warn) and on (info).
func BenchmarkResultLifecycle(b *testing.B) {
	src := identity.MustNew("cluster.local", "apps", "client")
	dst := identity.MustNew("cluster.local", "apps", "server")
	for _, lvl := range []zapcore.Level{zap.WarnLevel, zap.InfoLevel} {
		b.Run("log="+lvl.String(), func(b *testing.B) {
			m := NewMetrics(prometheus.NewRegistry())
			log := jsonLogger(lvl)
			b.ReportAllocs()
			for b.Loop() {
				lifecycle(m, log, src, dst)
			}
		})
	}
}
