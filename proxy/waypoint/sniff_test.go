package waypoint

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want sniffed
	}{
		{"", sniffUndecided},
		{"GET", sniffUndecided},
		{"GET /", sniffUndecided},
		{"GET / HTTP/1.", sniffUndecided},
		{"GET / HTTP/1.1\r", sniffUndecided},
		{"GET / HTTP/1.1\r\n", sniffHTTP1},
		{"POST /x?y=1 HTTP/1.0\r\nHost: a\r\n", sniffHTTP1},
		{"GET / HTTP/1.1\n", sniffHTTP1},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", sniffH2},
		{"PRI * HTTP/2", sniffUndecided},
		{"hello\n", sniffTCP},
		{"\x16\x03\x01\x02\x00", sniffTCP}, // a TLS ClientHello
		{"GET / HTTP/2.0\r\n", sniffTCP},
		{"GET  / HTTP/1.1\r\n", sniffTCP},
		{"GET / FTP/1.1\r\n", sniffTCP},
		{"GET /a\x01 HTTP/1.1\r\n", sniffTCP},
		{strings.Repeat("A", 40), sniffTCP},
	} {
		if got := classify([]byte(tc.in)); got != tc.want {
			t.Errorf("classify(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// autoConfig is baseConfig with both ports undeclared (AUTO) and a DENY
// for /admin, which only an HTTP request can match.
func autoConfig() *waypointapi.Config {
	cfg := baseConfig(&waypointapi.Policy{
		Name: "deny-admin", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{prefix("/admin")}}}}},
	})
	cfg.Services[0].Ports = []*waypointapi.Port{{Port: 80, Protocol: waypointapi.Protocol_AUTO}, {Port: 9000, Protocol: waypointapi.Protocol_AUTO}}
	return cfg
}

// TestAutoDetectHTTP: on a port of no declared protocol, HTTP/1.1 and
// HTTP/1.0 requests are detected and get L7 policy and routing.
func TestAutoDetectHTTP(t *testing.T) {
	l := newLab(t, autoConfig())
	c := l.client(clientID, clientIP)
	if code, body := get(t, c, "/admin/users"); code != 403 || body != DeniedBody {
		t.Errorf("GET /admin/users = %d %q, want 403 %q", code, body, DeniedBody)
	}
	if code, body := get(t, c, "/ok"); code != 200 || !strings.HasPrefix(body, "v1 GET /ok xff="+clientIP) {
		t.Errorf("GET /ok = %d %q, want 200 from v1", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tc, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	fmt.Fprintf(tc, "GET /ten HTTP/1.0\r\nHost: server.demo.svc.cluster.local\r\n\r\n")
	b, _ := io.ReadAll(tc)
	if !strings.HasPrefix(string(b), "HTTP/1.0 200") || !strings.Contains(string(b), "v1 GET /ten") {
		t.Errorf("HTTP/1.0 request answered %q, want HTTP/1.0 200 from v1", b)
	}
}

// TestAutoDetectTCP: bytes that are not HTTP are TCP at once; bytes that
// could still become HTTP, or none (a server-first protocol), are TCP once
// the detection timeout passes, replayed to the endpoint first.
func TestAutoDetectTCP(t *testing.T) {
	cfg := autoConfig()
	// A DENY with HTTP fields denies every TCP stream (Istio's rule).
	cfg.Policies = nil
	l := newLabWith(t, cfg, labOptions{configure: func(w *Waypoint) { w.opts.DetectTimeout = 100 * time.Millisecond }})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, first := range []string{"hello\n", "HELO", ""} {
		c, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":9000")
		if err != nil {
			t.Fatal(err)
		}
		if first != "" {
			fmt.Fprint(c, first)
		} else {
			time.Sleep(150 * time.Millisecond) // a server-first client waits
		}
		fmt.Fprint(c, " world\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if want := strings.TrimSuffix(first, "\n"); err != nil || (first == "hello\n" && line != "hello\n") || (first != "hello\n" && line != want+" world\n") {
			t.Errorf("first bytes %q: echo %q, %v", first, line, err)
		}
		c.Close()
	}
}
