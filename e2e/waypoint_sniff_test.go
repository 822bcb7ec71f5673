package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestWaypointProtocolSniffing: ports that declare no protocol (names
// without one of Istio's prefixes, no appProtocol) are sniffed by the real
// cmd/waypoint, as Istio does: an HTTPRoute on such a port applies to the
// HTTP requests sent to it (HTTP/1.1 and HTTP/1.0), a WebSocket upgrade
// passes through and carries bytes both ways after the 101, and a
// server-first TCP protocol (the server speaks first, the client waits)
// still works, as TCP once the detection timeout passes.
func TestWaypointProtocolSniffing(t *testing.T) {
	ctx := ctxT(t, 180*time.Second)
	handler := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			hj, ok := rw.(http.Hijacker)
			if !ok {
				http.Error(rw, "no hijack", 500)
				return
			}
			c, brw, err := hj.Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			// Not WebSocket framing: the proxy must not read it either.
			line, _ := brw.ReadString('\n')
			fmt.Fprintf(c, "echo %s", line)
			return
		}
		fmt.Fprintf(rw, "path=%s proto=%s x-route=%s", r.URL.Path, r.Proto, r.Header.Get("X-Route"))
	})
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "sniff", Service: "app", Handler: handler,
		ExtraPorts: []kube.ServicePort{{Name: "web", Port: 8000, TargetPort: 8080}, {Name: "db", Port: 3307, TargetPort: 9100}}})
	// A server-first protocol on the server pod: a greeting before the
	// client says anything, then an echo of one line.
	ln, err := w.Servers[0].Listen(":9100")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "220 hello from the server\n")
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "got %s", line)
			}()
		}
	}()
	apply(t, w.Mesh, "e2e-sniff-route", `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: sniff}
spec:
  parentRefs: [{group: "", kind: Service, name: app, port: 8000}]
  rules:
  - filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Route, value: sniffed}]}}]
    backendRefs: [{name: app, port: 8000}]
`)
	dial := func(ctx context.Context, port int) net.Conn {
		t.Helper()
		c, err := w.Client.Dial(ctx, "tcp", fmt.Sprintf("%s:%d", w.VIP, port))
		if err != nil {
			t.Fatalf("dial %s:%d: %v", w.VIP, port, err)
		}
		return c
	}
	host := "app.sniff.svc.cluster.local:8000"
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, 8000), nil }}}
	testkit.EventuallyErr(t, waitTimeout, "the HTTPRoute on the undeclared port to apply", func() error {
		resp, err := hc.Get("http://" + host + "/one")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := "path=/one proto=HTTP/1.1 x-route=sniffed"; resp.StatusCode != 200 || string(b) != want {
			return fmt.Errorf("GET /one = %d %q, want 200 %q", resp.StatusCode, b, want)
		}
		return nil
	})

	t.Run("HTTP/1.0", func(t *testing.T) {
		c := dial(ctx, 8000)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /ten HTTP/1.0\r\nHost: %s\r\n\r\n", host)
		b, err := io.ReadAll(c)
		if err != nil || !strings.HasPrefix(string(b), "HTTP/1.0 200") || !strings.HasSuffix(string(b), "x-route=sniffed") {
			t.Errorf("HTTP/1.0 GET answered %q (%v), want HTTP/1.0 200 through the route", b, err)
		}
	})
	t.Run("WebSocket", func(t *testing.T) {
		c := dial(ctx, 8000)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v, want 101", resp, err)
		}
		fmt.Fprintf(c, "\x81\x05hello\n")
		line, err := br.ReadString('\n')
		if err != nil || line != "echo \x81\x05hello\n" {
			t.Errorf("after the 101: %q (%v), want the bytes echoed", line, err)
		}
	})
	t.Run("ServerFirstTCP", func(t *testing.T) {
		c := dial(ctx, 3307)
		defer c.Close()
		// The waypoint's detection timeout (5s) passes before the greeting.
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		br := bufio.NewReader(c)
		greet, err := br.ReadString('\n')
		if err != nil || greet != "220 hello from the server\n" {
			t.Fatalf("greeting %q (%v)", greet, err)
		}
		fmt.Fprintf(c, "QUIT\n")
		if line, err := br.ReadString('\n'); err != nil || line != "got QUIT\n" {
			t.Errorf("answer %q (%v), want %q", line, err, "got QUIT\n")
		}
	})
}
