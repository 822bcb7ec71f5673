package telemetry

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	collogspb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	"google.golang.org/grpc"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// logsCollector is an OTLP/gRPC logs receiver that keeps what it gets.
type logsCollector struct {
	collogspb.UnimplementedLogsServiceServer
	mu      sync.Mutex
	records []string // body, then "k=v" attributes, space separated
}

func (c *logsCollector) Export(_ context.Context, req *collogspb.ExportLogsServiceRequest) (*collogspb.ExportLogsServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rl := range req.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			for _, r := range sl.GetLogRecords() {
				s := sl.GetScope().GetName() + ": " + r.GetBody().GetStringValue()
				for _, a := range r.GetAttributes() {
					s += " " + a.GetKey() + "=" + a.GetValue().GetStringValue()
				}
				c.records = append(c.records, s)
			}
		}
	}
	return &collogspb.ExportLogsServiceResponse{}, nil
}

// TestOTelAccessLog: an envoyOtelAls provider sends one OTLP log record
// per request to the collector, its body in Istio's default format and
// its labels as attributes, under the provider's logger name.
func TestOTelAccessLog(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	col := &logsCollector{}
	collogspb.RegisterLogsServiceServer(srv, col)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	rec, _, _ := newTestRecorder(t, Limits{})
	t.Cleanup(func() { rec.Close(context.Background()) })
	port := uint32(ln.Addr().(*net.TCPAddr).Port)
	c := rec.Compile(&waypointapi.Telemetry{AccessLogging: &waypointapi.AccessLogging{
		Providers: []*waypointapi.AccessLogProvider{{Name: "otel", Kind: &waypointapi.AccessLogProvider_Otel{Otel: &waypointapi.OtelAccessLog{
			Service: "127.0.0.1", Port: port, LogName: "otel_envoy_accesslog",
			Format: &waypointapi.LogFormat{Labels: map[string]string{"code": "%RESPONSE_CODE%"}},
		}}}},
	}})
	ex := httpEntry(t)
	ex.Telemetry = c
	rec.Record(ex)
	deadline := time.Now().Add(20 * time.Second)
	for {
		col.mu.Lock()
		got := strings.Join(col.records, "\n")
		col.mu.Unlock()
		if got != "" {
			if !strings.HasPrefix(got, `otel_envoy_accesslog: [`) || !strings.Contains(got, `"GET /a?b=1 HTTP/1.1" 200 - `) ||
				!strings.HasSuffix(got, " code=200") {
				t.Fatalf("record %q", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no record at the collector")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
