package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Each bad-input test proves three things: the bad peer gets a clear status
// or error, the server logs it exactly once, and a good client still works
// afterwards.

func logsContaining(logs *observer.ObservedLogs, substr string) int {
	return logs.FilterMessageSnippet(substr).Len()
}

func TestBadInputGarbage(t *testing.T) {
	m, up, srv := echoSetup(t)
	c, err := net.Dial("tcp", srv.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 64))
	// The server hangs up (a TLS alert at most, never a hang).
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("server did not close the garbage connection: %v", err)
	}
	c.Close()
	waitFor(t, "the rejection log", func() bool { return logsContaining(srv.logs, "rejected connection") == 1 })
	if e := srv.logs.All()[0]; e.ContextMap()["reason"] != "not TLS" {
		t.Errorf("log reason = %v, want not TLS", e.ContextMap()["reason"])
	}
	assertGoodClient(t, m, srv, up.addr)
	if n := srv.logs.Len(); n != 1 {
		t.Errorf("%d log lines, want 1: %v", n, srv.logs.All())
	}
}

func TestBadInputPlaintextHTTP(t *testing.T) {
	m, up, srv := echoSetup(t)
	resp, err := http.Get("http://" + srv.addr.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "HBONE") {
		t.Fatalf("plaintext client got %d %q, want 400 naming HBONE", resp.StatusCode, body)
	}
	waitFor(t, "the rejection log", func() bool { return logsContaining(srv.logs, "rejected connection") == 1 })
	assertGoodClient(t, m, srv, up.addr)
	if n := srv.logs.Len(); n != 1 {
		t.Errorf("%d log lines, want 1", n)
	}
}

// clientWithCert connects with cert instead of the mesh's client cert.
func connectWithCert(t *testing.T, m *mesh, srv *testServer, target netip.AddrPort, wc *identity.WorkloadCertificate) error {
	t.Helper()
	src := identity.NewStaticSource(wc)
	p, err := NewPool(PoolConfig{ClientConfig: ClientConfig{Certs: src}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	req := connectReq(srv, target)
	req.Src = wc.Identity
	tun, err := p.Connect(testCtx(t), req)
	if err == nil {
		tun.Close()
	}
	return err
}

func TestBadInputClientCerts(t *testing.T) {
	m := newMesh(t)
	rootKey, err := m.ca.RootKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	// Same root, other trust domain: chains fine, fails the trust-domain check.
	otherTD, err := ca.New(ca.Options{TrustDomain: "other.domain", RootCertPEM: m.ca.RootPEM(), RootKeyPEM: rootKey})
	if err != nil {
		t.Fatal(err)
	}
	foreignTD, err := otherTD.Issue(identity.MustNew("other.domain", "x", "y"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Another CA altogether; the client still trusts our server.
	stranger, _ := ca.New(ca.Options{})
	strangerCert, err := stranger.Issue(identity.MustNew("cluster.local", "x", "y"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	strangerCert.Roots = m.client.Roots
	// Our CA, but expired 20 minutes ago (the root is valid from an hour ago).
	past, err := ca.New(ca.Options{RootCertPEM: m.ca.RootPEM(), RootKeyPEM: rootKey,
		Now: func() time.Time { return time.Now().Add(-50 * time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := past.Issue(identity.MustNew("cluster.local", "x", "expired"), 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		wc      *identity.WorkloadCertificate
		wantLog string
	}{
		{"other trust domain", foreignTD, "trust domain"},
		{"unknown CA", strangerCert, "unknown authority"},
		{"expired", expired, "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startUpstream(t, echo)
			srv := startServer(t, m, dialHandler())
			err := connectWithCert(t, m, srv, up.addr, tc.wc)
			if !errors.Is(err, ErrHandshake) {
				t.Fatalf("err = %v, want ErrHandshake", err)
			}
			checkErrText(t, err)
			waitFor(t, "the rejection log", func() bool { return logsContaining(srv.logs, "rejected connection") == 1 })
			if e := srv.logs.All()[0]; !strings.Contains(e.ContextMap()["error"].(string), tc.wantLog) {
				t.Errorf("log error %q does not mention %q", e.ContextMap()["error"], tc.wantLog)
			}
			assertGoodClient(t, m, srv, up.addr)
			if n := srv.logs.Len(); n != 1 {
				t.Errorf("%d log lines, want 1: %v", n, srv.logs.All())
			}
		})
	}
}

// xnetClient is golang.org/x/net/http2's client with the mesh's client
// certificate: a third-party HTTP/2 implementation to send what our own
// client never would.
func xnetClient(m *mesh) *http.Client {
	return &http.Client{Transport: &http2.Transport{TLSClientConfig: &tls.Config{
		Certificates:       []tls.Certificate{m.client.TLS},
		InsecureSkipVerify: true,
		NextProtos:         []string{"h2"},
	}}}
}

func TestBadInputRequests(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, echo)
	for _, tc := range []struct {
		name      string
		method    string
		authority string
		wantLog   string
	}{
		{"GET", "GET", up.addr.String(), "not CONNECT"},
		{"POST", "POST", up.addr.String(), "not CONNECT"},
		{"hostname authority", "CONNECT", "example.com:80", "not ip:port"},
		{"no port", "CONNECT", "127.0.0.1", "not ip:port"},
		{"unbracketed IPv6", "CONNECT", "::1:80", "not ip:port"},
		{"port zero", "CONNECT", "127.0.0.1:0", "not ip:port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startServer(t, m, dialHandler())
			pr, pw := io.Pipe()
			defer pw.Close()
			req := &http.Request{Method: tc.method, URL: &url.URL{Scheme: "https", Host: srv.addr.String(), Path: "/"},
				Host: tc.authority, Header: http.Header{}, Body: pr}
			if tc.method == "CONNECT" {
				req.URL = &url.URL{Scheme: "https", Host: srv.addr.String()}
			}
			resp, err := xnetClient(m).Do(req.WithContext(testCtx(t)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 400 {
				t.Fatalf("status = %d, want 400", resp.StatusCode)
			}
			waitFor(t, "the rejection log", func() bool { return logsContaining(srv.logs, "rejected CONNECT") == 1 })
			if r := srv.logs.All()[0].ContextMap()["reason"].(string); !strings.Contains(r, tc.wantLog) {
				t.Errorf("log reason %q does not mention %q", r, tc.wantLog)
			}
			assertGoodClient(t, m, srv, up.addr)
			if n := srv.logs.Len(); n != 1 {
				t.Errorf("%d log lines, want 1", n)
			}
		})
	}
}

// TestInteropXNetClient: x/net's HTTP/2 client can CONNECT through our
// server (proof our server speaks HTTP/2 beyond our own client).
func TestInteropXNetClient(t *testing.T) {
	m, up, srv := echoSetup(t)
	pr, pw := io.Pipe()
	req := &http.Request{Method: "CONNECT", URL: &url.URL{Scheme: "https", Host: srv.addr.String()},
		Host: up.addr.String(), Header: http.Header{}, Body: pr}
	resp, err := xnetClient(m).Do(req.WithContext(testCtx(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	go func() { pw.Write([]byte("interop")); pw.Close() }()
	got, err := io.ReadAll(resp.Body)
	if err != nil || string(got) != "interop" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestInteropXNetServer: our client against x/net's HTTP/2 server.
func TestInteropXNetServer(t *testing.T) {
	m := newMesh(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{m.server.TLS}, NextProtos: []string{"h2"},
		ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "CONNECT" || r.Host != "10.1.2.3:8080" {
			w.WriteHeader(400)
			return
		}
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		buf := make([]byte, 1024)
		for {
			n, err := r.Body.Read(buf)
			w.Write(buf[:n])
			w.(http.Flusher).Flush()
			if err != nil {
				return
			}
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				if err := c.(*tls.Conn).Handshake(); err != nil {
					c.Close()
					return
				}
				(&http2.Server{}).ServeConn(c, &http2.ServeConnOpts{Handler: h})
			}()
		}
	}()
	p := newPool(t, m)
	req := &ConnectRequest{Key: Key{Src: clientID, Dst: []identity.Identity{serverID},
		NextHop: ln.Addr().(*net.TCPAddr).AddrPort()}, Authority: netip.MustParseAddrPort("10.1.2.3:8080")}
	tun := mustConnect(t, p, req)
	defer tun.Close()
	roundTrip(t, tun, "hello x/net")
	tun.CloseWrite()
	if rest, err := io.ReadAll(tun); err != nil || len(rest) != 0 {
		t.Fatalf("after CloseWrite: %q, %v", rest, err)
	}
}

// rawH2 is a TLS connection speaking raw HTTP/2 frames, for peers that
// misbehave on purpose.
type rawH2 struct {
	tc  *tls.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer
}

func dialRawH2(t *testing.T, m *mesh, addr netip.AddrPort) *rawH2 {
	t.Helper()
	tc, err := tls.Dial("tcp", addr.String(), &tls.Config{
		Certificates: []tls.Certificate{m.client.TLS}, InsecureSkipVerify: true, NextProtos: []string{"h2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	r := &rawH2{tc: tc, fr: http2.NewFramer(tc, tc)}
	r.enc = hpack.NewEncoder(&r.buf)
	io.WriteString(tc, http2.ClientPreface)
	r.fr.WriteSettings()
	return r
}

func (r *rawH2) connect(t *testing.T, sid uint32, authority string) {
	r.buf.Reset()
	r.enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	r.enc.WriteField(hpack.HeaderField{Name: ":authority", Value: authority})
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: r.buf.Bytes(), EndHeaders: true}); err != nil {
		t.Error(err)
	}
}

// TestBadInputStreamFlood opens thousands of streams at once: the server
// runs at most MaxConcurrentStreams, refuses the rest with REFUSED_STREAM,
// logs that once, and serves others meanwhile.
func TestBadInputStreamFlood(t *testing.T) {
	const flood = 3000
	m, up, srv := echoSetup(t)
	r := dialRawH2(t, m, srv.addr)
	go func() {
		for i := range flood {
			r.connect(t, uint32(2*i+1), up.addr.String())
		}
	}()
	refused, ok := 0, 0
	dec := hpack.NewDecoder(4096, nil)
	r.tc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for refused+ok < flood {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d refused, %d accepted: %v", refused, ok, err)
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			if f.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d reset with %v", f.StreamID, f.ErrCode)
			}
			refused++
		case *http2.HeadersFrame:
			hf, _ := dec.DecodeFull(f.HeaderBlockFragment())
			if len(hf) == 0 || hf[0].Value != "200" {
				t.Fatalf("stream %d answered %v", f.StreamID, hf)
			}
			ok++
		}
	}
	if ok > 200 || refused < flood-200 {
		t.Errorf("accepted %d and refused %d of %d; limit is 200", ok, refused, flood)
	}
	assertGoodClient(t, m, srv, up.addr)
	if n := logsContaining(srv.logs, "MAX_CONCURRENT_STREAMS"); n != 1 {
		t.Errorf("%d flood log lines, want 1", n)
	}
}

// TestBadInputStalledReader: a tunnel whose reader stops only stalls
// itself (flow control), other streams on the same connection and other
// clients carry on; a peer that stops reading the whole connection is
// dropped by the keepalive and logged once.
func TestBadInputStalledReader(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, echo)
	flood := startUpstream(t, func(c *net.TCPConn) {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	srv := startServer(t, m, dialHandler(), func(c *ServerConfig) {
		c.H2.KeepaliveInterval, c.H2.KeepaliveTimeout = 50*time.Millisecond, 200*time.Millisecond
	})

	t.Run("stream", func(t *testing.T) {
		p := newPool(t, m)
		stalled := mustConnect(t, p, connectReq(srv, flood.addr))
		defer stalled.Close()
		// Wait until the stalled stream has used its whole window.
		waitFor(t, "the stream window to fill", func() bool {
			stalled.c.mu.Lock()
			defer stalled.c.mu.Unlock()
			return stalled.q.n >= int(stalled.c.cfg.StreamWindow)
		})
		other := mustConnect(t, p, connectReq(srv, up.addr))
		defer other.Close()
		if other.c != stalled.c {
			t.Fatal("expected the second stream on the same connection")
		}
		roundTrip(t, other, "not blocked")
	})

	t.Run("connection", func(t *testing.T) {
		r := dialRawH2(t, m, srv.addr)
		r.connect(t, 1, flood.addr.String())
		// Never read: the server's writes and PINGs back up until the
		// keepalive gives up on us.
		waitFor(t, "the keepalive to drop the connection", func() bool {
			return logsContaining(srv.logs, "connection ended with error") == 1
		})
		e := srv.logs.FilterMessageSnippet("connection ended with error").All()[0]
		if !strings.Contains(e.ContextMap()["error"].(string), "keepalive") {
			t.Errorf("log error = %v, want the keepalive", e.ContextMap()["error"])
		}
		assertGoodClient(t, m, srv, up.addr)
	})
}

func TestBadInputRequestParse(t *testing.T) {
	f := func(kv ...string) []hpack.HeaderField {
		var out []hpack.HeaderField
		for i := 0; i < len(kv); i += 2 {
			out = append(out, hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		fields []hpack.HeaderField
		want   string // "" for a good request
	}{
		{"good", f(":method", "CONNECT", ":authority", "10.0.0.1:80", "baggage", "k=v", "traceparent", "t"), ""},
		{"missing method", f(":authority", "10.0.0.1:80"), "not CONNECT"},
		{"missing authority", f(":method", "CONNECT"), "not ip:port"},
		{"path", f(":method", "CONNECT", ":authority", "10.0.0.1:80", ":path", "/"), "extended CONNECT"},
		{"protocol", f(":method", "CONNECT", ":protocol", "websocket", ":authority", "10.0.0.1:80"), "extended CONNECT"},
		{"pseudo after regular", f(":method", "CONNECT", "baggage", "x", ":authority", "10.0.0.1:80"), "pseudo-header after"},
		{"unknown pseudo", f(":method", "CONNECT", ":bogus", "x", ":authority", "10.0.0.1:80"), "unknown pseudo"},
		{"uppercase", f(":method", "CONNECT", ":authority", "10.0.0.1:80", "Baggage", "x"), "uppercase"},
		{"connection header", f(":method", "CONNECT", ":authority", "10.0.0.1:80", "connection", "close"), "connection-specific"},
		{"dup authority", f(":method", "CONNECT", ":authority", "10.0.0.1:80", ":authority", "10.0.0.2:80"), "duplicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, status, reason := parseRequest(tc.fields, false)
			if tc.want == "" {
				if status != 0 || req.Authority != netip.MustParseAddrPort("10.0.0.1:80") || req.Baggage != "k=v" || req.Traceparent != "t" {
					t.Fatalf("got %+v, %d %q", req, status, reason)
				}
				return
			}
			if status != 400 || !strings.Contains(reason, tc.want) {
				t.Fatalf("got %d %q, want 400 mentioning %q", status, reason, tc.want)
			}
		})
	}
}

var _ = context.Background
