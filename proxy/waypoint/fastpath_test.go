package waypoint

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/h1"
)

// fastLab is the lab's waypoint with its upstream connections (both
// paths') going to an endpoint of the test's own; dials counts them.
type fastLab struct {
	*lab
	dials atomic.Int64
}

func newFastLab(t testing.TB, cfg *waypointapi.Config, backend string) *fastLab {
	return newFastLabWith(t, cfg, backend, false)
}

// newFastLabWith: slow serves every tunnel on the net/http path.
func newFastLabWith(t testing.TB, cfg *waypointapi.Config, backend string, slow bool) *fastLab {
	f := &fastLab{}
	f.lab = newLabWith(t, cfg, labOptions{configure: func(w *Waypoint) {
		w.slowPath = slow
		w.upstreamDial = func(ctx context.Context, _ netip.AddrPort, _ string) (net.Conn, error) {
			f.dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", backend)
		}
	}})
	return f
}

// goBackend serves h on loopback; conns counts its accepted connections.
func goBackend(t *testing.T, h http.HandlerFunc) (addr string, conns *atomic.Int64) {
	conns = new(atomic.Int64)
	srv := &http.Server{Handler: h, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	ln := listen(t, "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), conns
}

// rawBackend answers every request on a connection with the bytes answer
// returns for it; close: then closes the connection.
func rawBackend(t testing.TB, answer func(r *http.Request, body []byte) (raw string, close bool)) string {
	ln := listen(t, "127.0.0.1:0")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, _ := io.ReadAll(r.Body)
					raw, closeIt := answer(r, body)
					if _, err := io.WriteString(c, raw); err != nil || closeIt {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// rawClient is one tunnel to the service, spoken to in raw HTTP/1.1.
type rawClient struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

func (l *lab) rawClient(t testing.TB) *rawClient {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := l.tunnel(ctx, clientID, clientIP, svcVIP+":80")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

// do sends raw and reads the response, body and all.
func (rc *rawClient) do(raw string, method string) (*http.Response, string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, raw); err != nil {
		rc.t.Fatal(err)
	}
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading the response to %q: %v", raw, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("reading the body of the response to %q: %v", raw, err)
	}
	return resp, string(b)
}

// closed: the waypoint closed the connection (nothing more to read).
func (rc *rawClient) closed() bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err := rc.br.ReadByte()
	return err == io.EOF
}

const host = "server.demo.svc.cluster.local"

// TestFastPathKeepAlive: sequential requests on one downstream connection
// ride one upstream connection; when the client goes, the next client's
// requests take it from the idle pool instead of dialling.
func TestFastPathKeepAlive(t *testing.T) {
	var n atomic.Int64
	addr, conns := goBackend(t, func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "%d %s %s %s", n.Add(1), r.Method, r.URL.RequestURI(), b)
	})
	f := newFastLab(t, baseConfig(), addr)
	c := f.client(clientID, clientIP)
	for i := 0; i < 10; i++ {
		req, _ := http.NewRequest(http.MethodPost, "http://"+host+"/p?i="+strconv.Itoa(i), strings.NewReader("body-"+strconv.Itoa(i)))
		want := fmt.Sprintf("%d POST /p?i=%d body-%d", 2*i+1, i, i)
		if code, body := do(t, c, req); code != 200 || body != want {
			t.Fatalf("request %d = %d %q, want 200 %q", i, code, body, want)
		}
		if code, _ := get(t, c, "/g"); code != 200 {
			t.Fatalf("GET %d = %d", i, code)
		}
	}
	if d, k := f.dials.Load(), conns.Load(); d != 1 || k != 1 {
		t.Errorf("20 requests on one connection: %d dials, %d backend connections, want 1 and 1", d, k)
	}
	c.CloseIdleConnections()
	testkit.Eventually(t, 3*time.Second, "the upstream connection back in the idle pool", func() bool {
		return f.w.upstreams.IdleCount() == 1
	})
	c2 := f.client(clientID, clientIP)
	for i := 0; i < 3; i++ {
		if code, _ := get(t, c2, "/again"); code != 200 {
			t.Fatalf("second client GET = %d", code)
		}
	}
	if d := f.dials.Load(); d != 1 {
		t.Errorf("second client: %d dials in all, want the pooled connection reused (1)", d)
	}
	if fb := f.w.fallbacks.Load(); fb != 0 {
		t.Errorf("%d tunnels fell back to net/http, want none", fb)
	}
}

// TestFastPathChunked: chunked request bodies (a small one held and sent
// with its length, a large one streamed chunked), a chunked response with
// trailers, forwarded chunked with them.
func TestFastPathChunked(t *testing.T) {
	addr, _ := goBackend(t, func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rw.Header().Set("Trailer", "X-Sum")
		rw.Header().Set("X-Framing", fmt.Sprintf("cl=%d te=%v", r.ContentLength, r.TransferEncoding))
		for len(b) > 0 {
			k := min(len(b), 7000)
			rw.Write(b[:k])
			rw.(http.Flusher).Flush()
			b = b[k:]
		}
		rw.Header().Set("X-Sum", "done")
	})
	f := newFastLab(t, baseConfig(), addr)
	rc := f.rawClient(t)
	for _, size := range []int{100, 100 << 10} {
		body := bytes.Repeat([]byte("0123456789abcdef"), size/16)
		var req bytes.Buffer
		fmt.Fprintf(&req, "POST /echo HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n", host)
		for rest := body; len(rest) > 0; {
			k := min(len(rest), 3000)
			fmt.Fprintf(&req, "%x\r\n%s\r\n", k, rest[:k])
			rest = rest[k:]
		}
		req.WriteString("0\r\n\r\n")
		resp, got := rc.do(req.String(), http.MethodPost)
		if resp.StatusCode != 200 || got != string(body) {
			t.Fatalf("chunked POST of %d bytes = %d, %d bytes back, want 200 and the body", size, resp.StatusCode, len(got))
		}
		want := fmt.Sprintf("cl=%d te=[]", len(body)) // held: sent with its length
		if size > smallBodyMax {
			want = "cl=-1 te=[chunked]"
		}
		if fr := resp.Header.Get("X-Framing"); fr != want {
			t.Errorf("%d-byte chunked body reached the backend as %q, want %q", size, fr, want)
		}
		if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Errorf("response framing %v, want chunked", resp.TransferEncoding)
		}
		if s := resp.Trailer.Get("X-Sum"); s != "done" {
			t.Errorf("response trailer X-Sum = %q, want done", s)
		}
	}
}

// TestFastPathCloseDelimited: a response that ends when its connection
// closes goes on chunked, the downstream connection stays open, and the
// upstream connection is not reused.
func TestFastPathCloseDelimited(t *testing.T) {
	addr := rawBackend(t, func(r *http.Request, _ []byte) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close " + r.URL.Path, true
	})
	f := newFastLab(t, baseConfig(), addr)
	rc := f.rawClient(t)
	for _, p := range []string{"/a", "/b"} {
		resp, body := rc.do("GET "+p+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n", http.MethodGet)
		if resp.StatusCode != 200 || body != "until close "+p || resp.Close {
			t.Fatalf("GET %s = %d %q close=%v, want 200, the body and a kept connection", p, resp.StatusCode, body, resp.Close)
		}
	}
	if d := f.dials.Load(); d != 2 {
		t.Errorf("%d dials for two close-delimited responses, want 2", d)
	}
}

// TestFastPathSmuggling: heads whose framing is ambiguous or malformed
// are refused with 400, the connection closed, nothing sent upstream.
func TestFastPathSmuggling(t *testing.T) {
	addr, conns := goBackend(t, func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, "reached") })
	f := newFastLab(t, baseConfig(), addr)
	h := "Host: " + host + "\r\n"
	for name, raw := range map[string]string{
		"CL and TE":          "POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n",
		"TE and CL":          "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
		"differing CL":       "POST / HTTP/1.1\r\n" + h + "Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
		"bad chunk size":     "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
		"TE not chunked":     "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"two TE":             "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"negative CL":        "POST / HTTP/1.1\r\n" + h + "Content-Length: -1\r\n\r\n",
		"folded line":        "GET / HTTP/1.1\r\n" + h + "X-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n",
		"space before colon": "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
		"no Host":            "GET / HTTP/1.1\r\n\r\n",
		"two Hosts":          "GET / HTTP/1.1\r\n" + h + "Host: other\r\n\r\n",
	} {
		rc := f.rawClient(t)
		resp, _ := rc.do(raw, http.MethodPost)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, resp.StatusCode)
		}
		if !rc.closed() {
			t.Errorf("%s: the connection stayed open after the 400", name)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections reached the backend, want none", n)
	}
}

// TestFastPathHopByHop: hop-by-hop fields (RFC 9110 §7.6.1) and the ones
// Connection names go no further, either way; the client's own forwarding
// fields are replaced by the waypoint's; "TE: trailers" passes.
func TestFastPathHopByHop(t *testing.T) {
	seen := make(chan http.Header, 1)
	addr := rawBackend(t, func(r *http.Request, _ []byte) (string, bool) {
		seen <- r.Header.Clone()
		return "HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\n" +
			"Upgrade: foo\r\nProxy-Connection: keep-alive\r\nX-End: yes\r\nContent-Length: 2\r\n\r\nok", false
	})
	f := newFastLab(t, baseConfig(), addr)
	rc := f.rawClient(t)
	resp, body := rc.do("GET /h HTTP/1.1\r\nHost: "+host+"\r\nConnection: X-Secret, keep-alive\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\n"+
		"Proxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nTe: trailers, deflate\r\nX-Forwarded-For: 6.6.6.6\r\n"+
		"X-Forwarded-Host: evil\r\nForwarded: for=6.6.6.6\r\nX-Keep: yes\r\n\r\n", http.MethodGet)
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("GET /h = %d %q", resp.StatusCode, body)
	}
	up := <-seen
	for _, k := range []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection"} {
		if v, ok := up[k]; ok {
			t.Errorf("upstream request has %s: %q", k, v)
		}
	}
	if got := up.Get("Te"); got != "trailers" {
		t.Errorf("upstream Te = %q, want trailers", got)
	}
	if got := up.Get("X-Keep"); got != "yes" {
		t.Errorf("upstream X-Keep = %q, want yes (end-to-end)", got)
	}
	if got := up.Values("X-Forwarded-For"); len(got) != 1 || got[0] != clientIP {
		t.Errorf("upstream X-Forwarded-For = %q, want the client %s alone", got, clientIP)
	}
	if got := up.Get("X-Forwarded-Host"); got != host {
		t.Errorf("upstream X-Forwarded-Host = %q, want %s", got, host)
	}
	if got := up.Values("Forwarded"); len(got) != 1 || strings.Contains(got[0], "6.6.6.6") {
		t.Errorf("upstream Forwarded = %q, want the waypoint's own", got)
	}
	for _, k := range []string{"Connection", "X-Hop", "Keep-Alive", "Proxy-Authenticate", "Upgrade", "Proxy-Connection"} {
		if v, ok := resp.Header[k]; ok {
			t.Errorf("response has %s: %q", k, v)
		}
	}
	if resp.Header.Get("X-End") != "yes" || resp.Header.Get("Date") == "" {
		t.Errorf("response header %v, want X-End and a Date", resp.Header)
	}
}

// TestFastPathLargeBodies: 24 MiB up and 24 MiB down (of known length and
// chunked) stream through without the waypoint holding them: the heap
// stays far below a body's size.
func TestFastPathLargeBodies(t *testing.T) {
	const size = 24 << 20
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	addr, _ := goBackend(t, func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			fmt.Fprintf(rw, "%d %x", n, h.Sum(nil))
			return
		}
		if r.URL.Path == "/known" {
			rw.Header().Set("Content-Length", strconv.Itoa(size))
		}
		for i := 0; i < size/len(chunk); i++ {
			rw.Write(chunk)
		}
	})
	f := newFastLab(t, baseConfig(), addr)
	c := f.client(clientID, clientIP)
	c.Timeout = 60 * time.Second

	defer debug.SetGCPercent(debug.SetGCPercent(10)) // garbage is collected soon: what is left is held
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	}()
	xs := func() io.Reader { return io.LimitReader(repeatX{}, size) } // the body, never in memory whole
	h := sha256.New()
	io.Copy(h, xs())
	sum := h.Sum(nil)
	for _, known := range []bool{true, false} {
		req, _ := http.NewRequest(http.MethodPost, "http://"+host+"/up", xs())
		if known {
			req.ContentLength = size
		}
		if code, got := do(t, c, req); code != 200 || got != fmt.Sprintf("%d %x", size, sum) {
			t.Fatalf("POST of %d bytes (known length %v) = %d %q", size, known, code, got)
		}
	}
	for _, p := range []string{"/known", "/chunked"} {
		resp, err := c.Get("http://" + host + p)
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			t.Fatalf("GET %s: %d bytes, %v; want %d", p, n, err, size)
		}
	}
	close(stop)
	<-sampled
	if grew := int64(peak.Load()) - int64(base); grew > 12<<20 {
		t.Errorf("heap grew by %d MiB while streaming %d MiB bodies, want them streamed (< 12 MiB)", grew>>20, size>>20)
	}
	if fb := f.w.fallbacks.Load(); fb != 0 {
		t.Errorf("%d fallbacks, want none", fb)
	}
}

// TestFastPathRetryTimeout: the route's retries (a held body sent again
// intact) and its timeout (504, UT) on the fast path.
func TestFastPathRetryTimeout(t *testing.T) {
	var fails atomic.Int64
	var got atomic.Pointer[string]
	addr, _ := goBackend(t, func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/slow" {
			time.Sleep(time.Second)
		}
		if fails.Add(-1) >= 0 {
			http.Error(rw, "again", http.StatusServiceUnavailable)
			return
		}
		s := string(b)
		got.Store(&s)
		io.WriteString(rw, "fine")
	})
	cfg := baseConfig()
	cfg.Services[0].Routes = []*waypointapi.Route{{Name: "r", Namespace: "demo", Rules: []*waypointapi.RouteRule{
		{
			Matches:   []*waypointapi.RouteMatch{{Path: &waypointapi.PathMatch{Value: "/slow"}}},
			Backends:  []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 1}},
			TimeoutMs: 200,
		},
		{
			Backends: []*waypointapi.Backend{{Hostname: proxytest.Hostname("demo", "server-v1"), Namespace: "demo", Port: 80, Weight: 1}},
			Retry:    &waypointapi.Retry{Attempts: 2},
		},
	}}}
	f := newFastLab(t, cfg, addr)
	c := f.client(clientID, clientIP)
	fails.Store(2)
	req, _ := http.NewRequest(http.MethodPost, "http://"+host+"/r", strings.NewReader("payload-9"))
	if code, body := do(t, c, req); code != 200 || body != "fine" || *got.Load() != "payload-9" {
		t.Errorf("POST after two 503s = %d %q (backend got %q), want 200 with the body replayed", code, body, *got.Load())
	}
	fails.Store(3)
	if code, _ := get(t, c, "/r"); code != http.StatusServiceUnavailable {
		t.Errorf("GET after three 503s = %d, want 503", code)
	}
	fails.Store(0)
	start := time.Now()
	if code, _ := get(t, c, "/slow"); code != http.StatusGatewayTimeout || time.Since(start) > 900*time.Millisecond {
		t.Errorf("GET /slow = %d after %v, want 504 at the 200 ms timeout", code, time.Since(start))
	}
	if code, body := get(t, c, "/r"); code != 200 || body != "fine" {
		t.Errorf("GET after the timeout = %d %q, want 200", code, body)
	}
	if v := testutilCount(t, f.lab, "UT"); v != 1 {
		t.Errorf("%v requests with response_flags UT, want 1", v)
	}
}

// testutilCount sums istio_requests_total over the series with flags.
func testutilCount(t *testing.T, l *lab, flags string) float64 {
	mfs, err := l.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "istio_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "response_flags" && lp.GetValue() == flags {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// TestFastPathFallback: what the fast path leaves to net/http (an
// Upgrade, Expect: 100-continue, HTTP/1.0, a head too large for its
// buffer) is served there, on the same
// connection, after requests the fast path served.
func TestFastPathFallback(t *testing.T) {
	addr, _ := goBackend(t, func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			c, brw, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			io.WriteString(c, "echo: "+line)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "%s %s %s", r.Proto, r.URL.Path, b)
	})
	f := newFastLab(t, baseConfig(), addr)

	rc := f.rawClient(t)
	if resp, body := rc.do("GET /first HTTP/1.1\r\nHost: "+host+"\r\n\r\n", http.MethodGet); resp.StatusCode != 200 || body != "HTTP/1.1 /first " {
		t.Fatalf("GET /first = %d %q", resp.StatusCode, body)
	}
	if _, err := io.WriteString(rc.c, "GET /ws HTTP/1.1\r\nHost: "+host+"\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v, want 101", resp, err)
	}
	io.WriteString(rc.c, "ping\n")
	if line, _ := rc.br.ReadString('\n'); line != "echo: ping\n" {
		t.Errorf("through the upgraded connection: %q, want the echo", line)
	}

	c := f.client(clientID, clientIP)
	c.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Second
	req, _ := http.NewRequest(http.MethodPost, "http://"+host+"/expect", strings.NewReader("continued"))
	req.Header.Set("Expect", "100-continue")
	if code, body := do(t, c, req); code != 200 || body != "HTTP/1.1 /expect continued" {
		t.Errorf("POST with Expect: 100-continue = %d %q", code, body)
	}

	rc = f.rawClient(t)
	if resp, body := rc.do("GET /old HTTP/1.0\r\nHost: "+host+"\r\n\r\n", http.MethodGet); resp.StatusCode != 200 || body != "HTTP/1.1 /old " {
		t.Errorf("HTTP/1.0 GET = %d %q", resp.StatusCode, body)
	}
	rc = f.rawClient(t)
	big := "GET /bighead HTTP/1.1\r\nHost: " + host + "\r\nX-Big: " + strings.Repeat("b", h1.BufSize) + "\r\n\r\n"
	if resp, body := rc.do(big, http.MethodGet); resp.StatusCode != 200 || body != "HTTP/1.1 /bighead " {
		t.Errorf("GET with a %d-byte header = %d %q", h1.BufSize, resp.StatusCode, body)
	}
	if fb := f.w.fallbacks.Load(); fb != 4 {
		t.Errorf("%d fallbacks, want 4 (upgrade, expect, HTTP/1.0, a head larger than the buffer)", fb)
	}
}

// TestFastPathMatchesSlowPath: the same requests through both paths reach
// the backend with the same header and answer the client the same.
func TestFastPathMatchesSlowPath(t *testing.T) {
	seen := make(chan http.Header, 1)
	addr, _ := goBackend(t, func(rw http.ResponseWriter, r *http.Request) {
		h := r.Header.Clone()
		h.Set("Host", r.Host)
		seen <- h
		rw.Header().Set("X-Answer", "a")
		io.WriteString(rw, "body")
	})
	cfg := baseConfig()
	cfg.Services[0].Routes = []*waypointapi.Route{weightedRoute()}
	var results [2]struct {
		up   http.Header
		resp http.Header
		done bool
	}
	for i, slow := range []bool{false, true} {
		name := fmt.Sprintf("slow=%v", slow)
		ok := t.Run(name, func(t *testing.T) {
			f := newFastLabWith(t, cfg, addr, slow)
			c := f.client(clientID, clientIP)
			req, _ := http.NewRequest(http.MethodPost, "http://"+host+"/api/x?q=1", strings.NewReader("b"))
			req.Header.Set("User-Agent", "ua")
			req.Header.Set("x-drop", "gone")
			req.Header.Add("X-Multi", "1")
			req.Header.Add("X-Multi", "2")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
			results[i].up, results[i].resp = <-seen, resp.Header
			if fb := f.w.fallbacks.Load(); fb != 0 {
				t.Errorf("fallbacks = %d", fb)
			}
			c.CloseIdleConnections()
			results[i].done = true
		})
		// A subtest that skipped (its lab could not listen) leaves nothing
		// to compare: say so instead of reporting every header as missing.
		switch {
		case !ok:
			return
		case !results[i].done:
			t.Skipf("%s did not run to the end (skipped); nothing to compare", name)
		}
	}
	fast, slow := results[0], results[1]
	port := regexp.MustCompile(`:[0-9]+"`) // the client's port in Forwarded differs
	for _, k := range []string{"Host", "User-Agent", "X-Route", "X-Drop", "X-Multi", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded", "Content-Length"} {
		if port.ReplaceAllString(fmt.Sprint(fast.up[k]), "") != port.ReplaceAllString(fmt.Sprint(slow.up[k]), "") {
			t.Errorf("upstream %s: fast path %q, net/http path %q", k, fast.up[k], slow.up[k])
		}
	}
	for _, k := range []string{"X-Answer", "Content-Length", "Content-Type"} {
		if fmt.Sprint(fast.resp[k]) != fmt.Sprint(slow.resp[k]) {
			t.Errorf("response %s: fast path %q, net/http path %q", k, fast.resp[k], slow.resp[k])
		}
	}
}

// repeatX reads as an endless run of 'x'.
type repeatX struct{}

func (repeatX) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestFastPathShutdown: Shutdown ends an idle keep-alive connection of the
// fast path (EOF to the client, closed in a second if it does not close)
// instead of waiting for its context to end. This client never closes.
func TestFastPathShutdown(t *testing.T) {
	addr, _ := goBackend(t, func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, "up") })
	f := newFastLab(t, baseConfig(), addr)
	rc := f.rawClient(t)
	if resp, body := rc.do("GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n", http.MethodGet); resp.StatusCode != 200 || body != "up" {
		t.Fatalf("GET / = %d %q", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := f.w.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Shutdown took %v with one idle connection, want it closed within a second", d)
	}
	if !rc.closed() {
		t.Error("the idle connection is still open after Shutdown")
	}
}

// TestInvalidRequestTarget: a request target the filters would read as one
// path and the endpoint be sent as another ("scheme:opaque", whose path is
// empty to routes and authorization; "http://host", whose empty path goes
// upstream as "/") is refused 400 on both paths, and never reaches the
// endpoint: here a DENY on exactly "/" would not have matched it.
func TestInvalidRequestTarget(t *testing.T) {
	addr, conns := goBackend(t, func(rw http.ResponseWriter, r *http.Request) { io.WriteString(rw, "up "+r.RequestURI) })
	cfg := baseConfig(&waypointapi.Policy{Name: "deny-root", Namespace: "demo", Action: waypointapi.Action_DENY,
		Rules: []*waypointapi.Rule{{To: []*waypointapi.Operation{{Paths: []*waypointapi.StringMatch{exact("/")}}}}}})
	f := newFastLab(t, cfg, addr)
	for _, tc := range []struct{ name, raw string }{
		{"opaque target", "GET a:b HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
		{"absolute form without a path", "GET http://" + host + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
		{"another scheme", "GET ftp:/x HTTP/1.1\r\nHost: " + host + "\r\n\r\n"},
		{"opaque target, HTTP/1.0 (the net/http path)", "GET a:b HTTP/1.0\r\nHost: " + host + "\r\n\r\n"},
		{"absolute form without a path, HTTP/1.0", "GET http://" + host + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := f.rawClient(t)
			if resp, body := rc.do(tc.raw, http.MethodGet); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "invalid request target") {
				t.Errorf("= %d %q, want 400 invalid request target", resp.StatusCode, body)
			}
		})
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections reached the endpoint, want none", n)
	}
	rc := f.rawClient(t)
	if resp, body := rc.do("GET /ok HTTP/1.1\r\nHost: "+host+"\r\n\r\n", http.MethodGet); resp.StatusCode != 200 || body != "up /ok" {
		t.Errorf("origin form = %d %q", resp.StatusCode, body)
	}
}
