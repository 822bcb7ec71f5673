package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

func TestTunnelEcho(t *testing.T) {
	m, up, srv := echoSetup(t)
	p := newPool(t, m)
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	defer tun.Close()
	if got := tun.PeerIdentity(); got != serverID {
		t.Errorf("PeerIdentity = %v, want %v", got, serverID)
	}
	roundTrip(t, tun, "hello")
	roundTrip(t, tun, "x")
}

// TestMultiStreamTransfer sends 8 concurrent streams of random data
// through pool → server → echo and checks every byte that comes back.
func TestMultiStreamTransfer(t *testing.T) {
	const streams, size = 8, 3 << 20
	m, up, srv := echoSetup(t)
	p := newPool(t, m)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := make([]byte, size+i*1234)
			rand.Read(data)
			tun, err := p.Connect(ctx, connectReq(srv, up.addr))
			if err != nil {
				errs <- err
				return
			}
			defer tun.Close()
			go func() {
				// Odd-sized writes exercise frame splitting.
				for rest := data; len(rest) > 0; {
					n := min(len(rest), 100_000+i)
					if _, err := tun.Write(rest[:n]); err != nil {
						errs <- err
						return
					}
					rest = rest[n:]
				}
				tun.CloseWrite()
			}()
			got, err := io.ReadAll(tun)
			if err != nil {
				errs <- err
				return
			}
			if sha256.Sum256(got) != sha256.Sum256(data) {
				errs <- errors.New("stream data corrupted")
				return
			}
			if tun.BytesSent() != int64(len(data)) || tun.BytesReceived() != int64(len(data)) {
				errs <- errors.New("byte counters wrong")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestHalfClose checks both directions: the client's CloseWrite reaches the
// upstream as EOF while the upstream keeps writing, and the upstream's
// half-close reaches the client as EOF while the client keeps writing.
func TestHalfClose(t *testing.T) {
	m := newMesh(t)
	srv := startServer(t, m, dialHandler())
	p := newPool(t, m)

	t.Run("client first", func(t *testing.T) {
		// Upstream reads to EOF, then answers and closes.
		up := startUpstream(t, func(c *net.TCPConn) {
			b, _ := io.ReadAll(c)
			c.Write(append([]byte("got:"), b...))
			c.CloseWrite()
		})
		tun := mustConnect(t, p, connectReq(srv, up.addr))
		defer tun.Close()
		tun.Write([]byte("request"))
		if err := tun.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(tun)
		if err != nil || string(got) != "got:request" {
			t.Fatalf("read %q, %v; want got:request", got, err)
		}
	})

	t.Run("upstream first", func(t *testing.T) {
		// Upstream greets and half-closes, then reads what the client sends.
		gotc := make(chan string, 1)
		up := startUpstream(t, func(c *net.TCPConn) {
			c.Write([]byte("greeting"))
			c.CloseWrite()
			b, _ := io.ReadAll(c)
			gotc <- string(b)
		})
		tun := mustConnect(t, p, connectReq(srv, up.addr))
		defer tun.Close()
		got, err := io.ReadAll(tun)
		if err != nil || string(got) != "greeting" {
			t.Fatalf("read %q, %v; want greeting then EOF", got, err)
		}
		// Our direction is still open after the peer's EOF.
		if _, err := tun.Write([]byte("after-eof")); err != nil {
			t.Fatal(err)
		}
		tun.CloseWrite()
		if g := <-gotc; g != "after-eof" {
			t.Fatalf("upstream got %q, want after-eof", g)
		}
	})
}

func TestByteCounters(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, func(c *net.TCPConn) {
		io.Copy(io.Discard, c)
		c.Write(bytes.Repeat([]byte("r"), 777))
		c.CloseWrite()
	})
	stats := make(chan TunnelStats, 1)
	srv := startServer(t, m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		up, err := net.Dial("tcp", req.Authority.String())
		if err != nil {
			return Reply{Status: 503}
		}
		return Reply{Upstream: up, Done: func(s TunnelStats, err error) {
			if err != nil {
				t.Errorf("server tunnel ended with %v", err)
			}
			stats <- s
		}}
	}))
	p := newPool(t, m)
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	tun.Write(make([]byte, 12345))
	if tun.BytesSent() != 12345 {
		t.Errorf("BytesSent mid-stream = %d, want 12345", tun.BytesSent())
	}
	tun.CloseWrite()
	io.Copy(io.Discard, tun)
	tun.Close()
	want := TunnelStats{BytesSent: 12345, BytesReceived: 777}
	if got := tun.Stats(); got != want {
		t.Errorf("client stats = %+v, want %+v", got, want)
	}
	// The server sees the mirror image.
	if got := <-stats; got != (TunnelStats{BytesSent: 777, BytesReceived: 12345}) {
		t.Errorf("server stats = %+v, want sent 777 received 12345", got)
	}
}

// TestSpliceSmallFramesSlowSink sends small frames (which the server's read
// loop writes straight to the spliced socket while it has room) to an app
// that first does not read, so the socket fills, writes come up short and
// the rest queues for the drain goroutine; every byte must come back in
// order.
func TestSpliceSmallFramesSlowSink(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, func(c *net.TCPConn) {
		c.SetReadBuffer(64 << 10)
		time.Sleep(300 * time.Millisecond)
		echo(c)
	})
	srv := startServer(t, m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		var d net.Dialer
		up, err := d.DialContext(ctx, "tcp", req.Authority.String())
		if err != nil {
			return Reply{Status: 503}
		}
		up.(*net.TCPConn).SetWriteBuffer(32 << 10) // fills while the app sleeps
		return Reply{Upstream: up}
	}))
	p := newPool(t, m)
	tun := mustConnect(t, p, connectReq(srv, up.addr))
	defer tun.Close()
	data := make([]byte, 3<<20)
	rand.Read(data)
	errc := make(chan error, 1)
	go func() {
		rest := data
		for i := 0; len(rest) > 0; i++ {
			n := min(len(rest), 1+(i*7919)%(16<<10))
			if _, err := tun.Write(rest[:n]); err != nil {
				errc <- err
				return
			}
			rest = rest[n:]
		}
		errc <- tun.CloseWrite()
	}()
	got, err := io.ReadAll(tun)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echoed %d bytes, want the %d sent, in order", len(got), len(data))
	}
}
