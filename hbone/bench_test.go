package hbone

import (
	"context"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// BenchmarkTunnelThroughput pushes 64 KiB writes through pool → server →
// TCP sink (for profiling; bench/hbone reports the ratio to direct TCP).
func BenchmarkTunnelThroughput(b *testing.B) {
	m := newMesh(b)
	up := startUpstream(b, func(c *net.TCPConn) {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
	srv := startServer(b, m, dialHandler())
	p := newPool(b, m)
	tun := mustConnect(b, p, connectReq(srv, up.addr))
	defer tun.Close()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for range b.N {
		if _, err := tun.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTunnelRoundTrip is a 1-byte echo through the tunnel.
func BenchmarkTunnelRoundTrip(b *testing.B) {
	m, up, srv := echoSetup(b)
	p := newPool(b, m)
	tun := mustConnect(b, p, connectReq(srv, up.addr))
	defer tun.Close()
	one := []byte{1}
	b.ResetTimer()
	for range b.N {
		tun.Write(one)
		if _, err := io.ReadFull(tun, one); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandshake dials and closes HBONE connections (both ends here).
func BenchmarkHandshake(b *testing.B) {
	m := newMesh(b)
	srv := startServer(b, m, dialHandler())
	cfg := &ClientConfig{Certs: m.certs}
	key := connectReq(srv, srv.addr).Key
	b.ResetTimer()
	for range b.N {
		cc, err := Dial(testCtx(b), cfg, key)
		if err != nil {
			b.Fatal(err)
		}
		cc.Close()
	}
}

// BenchmarkSpliceRR1K is a 1 KiB request/response through the whole
// in-process chain the node proxies run: app → TCP → Splice (client side)
// → HBONE → server → Splice → TCP → echo app and back. It reports the
// process's CPU time per round trip (cpu-ns/op) besides wall time, as the
// figure to compare on a shared machine.
func BenchmarkSpliceRR1K(b *testing.B) { spliceRR(b, 1<<10) }

// BenchmarkSpliceRR1200 is the same with 1200-byte messages, an HTTP
// request or response with a 1 KiB body and its headers.
func BenchmarkSpliceRR1200(b *testing.B) { spliceRR(b, 1200) }

func spliceRR(b *testing.B, size int) {
	m := newMesh(b)
	up := startUpstream(b, func(c *net.TCPConn) {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	srv := startServer(b, m, dialHandler())
	p := newPool(b, m)
	front := startUpstream(b, func(c *net.TCPConn) {
		tun, err := p.Connect(context.Background(), connectReq(srv, up.addr))
		if err != nil {
			return
		}
		Splice(tun, c)
	})
	app, err := net.Dial("tcp", front.addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer app.Close()
	buf := make([]byte, size)
	rr := func() {
		if _, err := app.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(app, buf); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		rr()
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	b.ResetTimer()
	for range b.N {
		rr()
	}
	b.StopTimer()
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&ms1)
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N), "mallocs/op")
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSpliceConnect is one new connection through the in-process
// chain on a warm pool: app connect → client-side Splice → CONNECT on the
// pooled HBONE connection → server dials the app, which speaks first →
// the first byte back; then close. It reports CPU per connection.
func BenchmarkSpliceConnect(b *testing.B) {
	m := newMesh(b)
	up := startUpstream(b, func(c *net.TCPConn) {
		c.Write([]byte{1})
		io.Copy(io.Discard, c)
	})
	srv := startServer(b, m, dialHandler())
	p := newPool(b, m)
	front := startUpstream(b, func(c *net.TCPConn) {
		tun, err := p.Connect(context.Background(), connectReq(srv, up.addr))
		if err != nil {
			return
		}
		Splice(tun, c)
	})
	one := make([]byte, 1)
	conn := func() {
		c, err := net.Dial("tcp", front.addr.String())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	for range 20 {
		conn()
	}
	cpu0 := processCPU()
	b.ResetTimer()
	for range b.N {
		conn()
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
