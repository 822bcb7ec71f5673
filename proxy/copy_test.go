package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// onlyConn hides *net.TCPConn so the buffered path is exercised.
type onlyConn struct{ net.Conn }

func (c onlyConn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

func TestBidirectionalHalfCloseAndCounts(t *testing.T) {
	for _, name := range []string{"splice", "buffered"} {
		t.Run(name, func(t *testing.T) {
			client, downSrv := testkit.TCPPair(t) // client ↔ proxy's downstream socket
			upCli, server := testkit.TCPPair(t)   // proxy's upstream socket ↔ server
			var down, up net.Conn = downSrv, upCli
			if name == "buffered" {
				down, up = onlyConn{downSrv}, onlyConn{upCli}
			}
			var c Counters
			done := make(chan error, 1)
			go func() { done <- Bidirectional(down, up, &c, nil) }()

			req := make([]byte, 3<<20)
			rand.Read(req)
			go func() { client.Write(req); client.CloseWrite() }()
			got, err := io.ReadAll(server) // EOF only if the half-close passed through
			if err != nil || !bytes.Equal(got, req) {
				t.Fatalf("server got %d bytes (err %v), want %d intact", len(got), err, len(req))
			}
			resp := []byte("response after the client half-closed")
			server.Write(resp)
			server.CloseWrite()
			back, err := io.ReadAll(client)
			if err != nil || !bytes.Equal(back, resp) {
				t.Fatalf("client got %q (err %v)", back, err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Bidirectional did not return after both halves closed")
			}
			if c.Sent.Load() != int64(len(req)) || c.Received.Load() != int64(len(resp)) {
				t.Fatalf("counters sent=%d recv=%d", c.Sent.Load(), c.Received.Load())
			}
		})
	}
}

func TestBidirectionalForce(t *testing.T) {
	_, down := testkit.TCPPair(t)
	up, _ := testkit.TCPPair(t)
	force, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var c Counters
	go func() { done <- Bidirectional(down, up, &c, force) }()
	cancel()
	select {
	case err := <-done:
		if err != ErrForced {
			t.Fatalf("err = %v, want ErrForced", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("force did not end the copy")
	}
}

func TestBufferedCopySteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation budgets are checked by the non-race run (make test runs both)")
	}
	src := bytes.NewReader(make([]byte, 1<<20))
	var dst net.Conn = discardConn{}
	var c Counters
	// Warm the pools.
	var rc net.Conn = readerConn{src}
	bufferedCopy(dst, rc, &c.Sent)
	allocs := testing.AllocsPerRun(20, func() {
		src.Seek(0, io.SeekStart)
		bufferedCopy(dst, rc, &c.Sent)
	})
	if allocs > 0 {
		t.Fatalf("bufferedCopy allocates %.1f times per copy; want pooled buffers", allocs)
	}
}

type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error) { return len(b), nil }

type readerConn struct{ r io.Reader }

func (r readerConn) Read(b []byte) (int, error)     { return r.r.Read(b) }
func (readerConn) Write(b []byte) (int, error)      { return len(b), nil }
func (readerConn) Close() error                     { return nil }
func (readerConn) LocalAddr() net.Addr              { return nil }
func (readerConn) RemoteAddr() net.Addr             { return nil }
func (readerConn) SetDeadline(time.Time) error      { return nil }
func (readerConn) SetReadDeadline(time.Time) error  { return nil }
func (readerConn) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkPassthroughConnect is one short connection through a spliced
// passthrough: connect, the server's first byte, close (what bench/mesh's
// connect figure times), with the proxy's accept, upstream dial and
// Bidirectional on loopback. It reports the process's CPU per connection.
func BenchmarkPassthroughConnect(b *testing.B) {
	greeter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer greeter.Close()
	go func() {
		for {
			c, err := greeter.Accept()
			if err != nil {
				return
			}
			c.Write([]byte{1})
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer front.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for {
			c, err := front.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", greeter.Addr().String())
				if err != nil {
					return
				}
				defer up.Close()
				var n Counters
				Bidirectional(c, up, &n, ctx)
			}()
		}
	}()
	one := make([]byte, 1)
	cpu0, sw0 := processCPU(), ctxSwitches()
	b.ResetTimer()
	for range b.N {
		c, err := net.Dial("tcp", front.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(ctxSwitches()-sw0)/float64(b.N), "ctxsw/op")
}

// ctxSwitches sums the context switches of this process's threads.
func ctxSwitches() int64 {
	var total int64
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		b, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		for _, l := range strings.Split(string(b), "\n") {
			if _, v, ok := strings.Cut(l, "ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				total += n
			}
		}
	}
	return total
}

// processCPU is this process's user+system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestBidirectionalGoroutines: an open spliced connection parks the
// caller's goroutine and one for the other direction, both copying, and
// nothing per connection for the force (idle connections hold stacks).
func TestBidirectionalGoroutines(t *testing.T) {
	const conns = 50
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, conns)
	for range conns {
		_, down := testkit.TCPPair(t)
		up, _ := testkit.TCPPair(t)
		go func() { done <- Bidirectional(down, up, &Counters{}, ctx) }()
	}
	// Goroutines of this test's Bidirectional calls, and how many of them
	// are in a copy (the rest would be watchers).
	count := func() (all, copying int) {
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "proxy.Bidirectional") {
				all++
				if strings.Contains(g, "proxy.copyHalf") {
					copying++
				}
			}
		}
		return all, copying
	}
	var all, copying int
	for range 200 {
		if all, copying = count(); copying == 2*conns {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if all != 2*conns || copying != 2*conns {
		t.Errorf("%d goroutines (%d copying) for %d open connections, want %d, all copying", all, copying, conns, 2*conns)
	}
	cancel()
	for range conns {
		if err := <-done; err != ErrForced {
			t.Fatalf("err = %v, want ErrForced", err)
		}
	}
}
