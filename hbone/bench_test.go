package hbone

import (
	"io"
	"net"
	"testing"
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
