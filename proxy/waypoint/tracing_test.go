package waypoint

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/otlptest"
)

func tracingConfig(rcv *otlptest.Receiver, pct float64, proto waypointapi.TracingProvider_Protocol) *waypointapi.Config {
	cfg := baseConfig()
	addr := rcv.GRPCAddr
	if proto == waypointapi.TracingProvider_HTTP {
		addr = rcv.HTTPAddr
	}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	cfg.Telemetry = &waypointapi.Telemetry{Tracing: &waypointapi.Tracing{
		Provider:                 &waypointapi.TracingProvider{Name: "otel", Service: host, Port: uint32(p), Protocol: proto},
		RandomSamplingPercentage: pct,
		CustomTags:               []*waypointapi.CustomTag{{Name: "team", Type: &waypointapi.CustomTag_Literal{Literal: "mesh"}}},
	}}
	return cfg
}

// TestTracing: on both paths, a request with a traceparent gives a span
// whose parent is the client's span, the upstream receives a traceparent
// whose parent is that span and an x-request-id; a config push changes the
// sampling live.
func TestTracing(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast", true: "slow"}[slow], func(t *testing.T) {
			rcv := otlptest.Start(t)
			var mu sync.Mutex
			var seen []http.Header
			backend, _ := goBackend(t, func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.Header.Clone())
				mu.Unlock()
				fmt.Fprint(w, "hello")
			})
			l := newFastLabWith(t, tracingConfig(rcv, 100, waypointapi.TracingProvider_GRPC), backend, slow)
			l.w.tracer.BatchTimeout = 10 * time.Millisecond // before the config that starts the pipeline
			l.setConfig(tracingConfig(rcv, 0, waypointapi.TracingProvider_HTTP))
			c := l.client(clientID, clientIP)
			last := func() http.Header {
				mu.Lock()
				defer mu.Unlock()
				return seen[len(seen)-1]
			}

			tid := "4bf92f3577b34da6a3ce929d0e0e4736"
			if code, _ := get(t, c, "/a", "traceparent", "00-"+tid+"-00f067aa0ba902b7-01"); code != http.StatusOK {
				t.Fatalf("code %d", code)
			}
			up := last()
			sp := rcv.WaitTrace(t, tid)
			if sp.ParentID != "00f067aa0ba902b7" {
				t.Errorf("waypoint span's parent %s, want the client's", sp.ParentID)
			}
			if want := "00-" + tid + "-" + sp.SpanID + "-01"; up.Get("traceparent") != want {
				t.Errorf("upstream traceparent %q, want %q", up.Get("traceparent"), want)
			}
			if up.Get("x-b3-spanid") != sp.SpanID || up.Get("x-b3-parentspanid") != "00f067aa0ba902b7" {
				t.Errorf("upstream B3 %v", up)
			}
			if rid := up.Get("x-request-id"); len(rid) != 36 || sp.Attrs["guid:x-request-id"] != rid {
				t.Errorf("x-request-id %q, span's %q", rid, sp.Attrs["guid:x-request-id"])
			}
			if sp.Attrs["team"] != "mesh" || sp.Attrs["http.status_code"] != "200" || sp.Attrs["istio.canonical_service"] != "waypoint" {
				t.Errorf("attributes %v", sp.Attrs)
			}
			// Envoy's size tags are body bytes: a GET without a body, "hello" back.
			if sp.Attrs["request_size"] != "0" || sp.Attrs["response_size"] != "5" {
				t.Errorf("request_size %q, response_size %q, want the bodies' 0 and 5", sp.Attrs["request_size"], sp.Attrs["response_size"])
			}

			// 0%: a new trace is not sampled, but propagated.
			if code, _ := get(t, c, "/b"); code != http.StatusOK {
				t.Fatalf("code %d", code)
			}
			unsampled := last().Get("traceparent")
			if !strings.HasSuffix(unsampled, "-00") {
				t.Fatalf("upstream traceparent %q, want an unsampled one", unsampled)
			}
			// Live: 100% now; the next new trace is exported, the one
			// before never is (spans are exported in order).
			l.setConfig(tracingConfig(rcv, 100, waypointapi.TracingProvider_HTTP))
			if code, _ := get(t, c, "/c", "x-request-id", "given-id"); code != http.StatusOK {
				t.Fatalf("code %d", code)
			}
			third := last()
			if third.Get("x-request-id") != "given-id" {
				t.Errorf("x-request-id %q, want the client's", third.Get("x-request-id"))
			}
			sp3 := rcv.WaitTrace(t, strings.Split(third.Get("traceparent"), "-")[1])
			if sp3.ParentID != "" {
				t.Errorf("a new trace's span has parent %s", sp3.ParentID)
			}
			for _, s := range rcv.Spans() {
				if s.TraceID == strings.Split(unsampled, "-")[1] {
					t.Errorf("the unsampled request's span was exported")
				}
			}
			// Tracing off: trace headers pass through untouched.
			l.setConfig(baseConfig())
			get(t, c, "/d", "traceparent", "00-"+tid+"-00f067aa0ba902b7-01")
			if got := last().Get("traceparent"); got != "00-"+tid+"-00f067aa0ba902b7-01" {
				t.Errorf("tracing off: upstream traceparent %q, want the client's", got)
			}
		})
	}
}

// TestTCPTraceparent: the traceparent of a TCP stream's CONNECT goes on to
// the endpoint's node proxy on the waypoint's own CONNECT.
func TestTCPTraceparent(t *testing.T) {
	l := newLab(t, baseConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: l.certs, Dial: dialFrom(netip.MustParseAddr(clientIP))}})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	c, err := pool.Connect(ctx, &hbone.ConnectRequest{
		Key: hbone.Key{Src: clientID, Dst: []identity.Identity{wpID}, SrcIP: netip.MustParseAddr(clientIP),
			NextHop: netip.MustParseAddrPort(wpIP + ":15008")},
		Authority: netip.MustParseAddrPort(svcVIP + ":9000"), Traceparent: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
	if got := l.lastTraceparent.Load(); got == nil || *got != tp {
		t.Errorf("the endpoint's node proxy got traceparent %v, want the client's %s", got, tp)
	}
}
