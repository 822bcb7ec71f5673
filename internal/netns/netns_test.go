package netns_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

func TestOpenRejectsNonNetns(t *testing.T) {
	for _, path := range []string{"/proc/self/ns/uts", "/proc/self/status"} {
		h, err := netns.Open(path)
		if !errors.Is(err, netns.ErrNotNetns) {
			h.Close()
			t.Errorf("Open(%s) = %v, want ErrNotNetns", path, err)
		}
	}
	if _, err := netns.Open("/nonexistent/ns"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(missing) = %v, want ErrNotExist", err)
	}
}

func TestIDOfSameNamespaceIsEqual(t *testing.T) {
	// The calling thread's namespace through two paths (not /proc/self,
	// which is the main thread's: a test may strand it on purpose).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := netns.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.ID() != b.ID() || a.ID() == (netns.ID{}) {
		t.Fatalf("Current %v != /proc/self/task/<tid>/ns/net %v", a.ID(), b.ID())
	}
	fd, err := unix.Dup(a.FD())
	if err != nil {
		t.Fatal(err)
	}
	c, err := netns.FromFD(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ID() != a.ID() {
		t.Fatalf("FromFD(dup) %v != %v", c.ID(), a.ID())
	}
}

func TestFromFDRejectsAndClosesNonNetns(t *testing.T) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netns.FromFD(fd); !errors.Is(err, netns.ErrNotNetns) {
		t.Fatalf("FromFD(file) = %v, want ErrNotNetns", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Fatalf("fd %d still open after FromFD error (fcntl err %v)", fd, err)
	}
}

func TestNilHandleRunsInCurrentNamespace(t *testing.T) {
	var h *netns.Handle
	ran := false
	if err := h.Do(func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("nil Do: ran=%v err=%v", ran, err)
	}
	ln, err := h.Listen(context.Background(), netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("listener from nil handle not reachable from this namespace: %v", err)
	}
	c.Close()
}

func TestIDDistinguishesNamespaces(t *testing.T) {
	roottest.Require(t)
	a := netnstest.New(t, "a")
	b := netnstest.New(t, "b")
	root := current(t)
	again, err := netns.Open("/var/run/netns/" + a.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.ID() != a.ID() {
		t.Errorf("same namespace opened twice: %v != %v", again.ID(), a.ID())
	}
	if a.ID() == b.ID() || a.ID() == root.ID() {
		t.Errorf("distinct namespaces share an ID: a=%v b=%v root=%v", a.ID(), b.ID(), root.ID())
	}
}

func TestDoEntersAndRestores(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "a")
	root := current(t)

	errc := make(chan error, 32)
	for range cap(errc) {
		go func() {
			errc <- ns.Do(func() error {
				inside, err := netns.Current()
				if err != nil {
					return err
				}
				defer inside.Close()
				if inside.ID() != ns.ID() {
					return errors.New("Do did not enter the namespace")
				}
				return nil
			})
		}()
	}
	for range cap(errc) {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if got := current(t).ID(); got != root.ID() {
		t.Fatalf("after Do: %v, want %v", got, root.ID())
	}
	if n := threadsIn(t, ns.ID()); n != 0 {
		t.Fatalf("%d threads still in the target namespace after Do", n)
	}
	wantErr := errors.New("from fn")
	if err := ns.Do(func() error { return wantErr }); !errors.Is(err, wantErr) {
		t.Fatalf("Do error = %v, want fn's error", err)
	}
}

func TestDoRepanicsAfterRestoring(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "a")
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want boom", v)
			}
		}()
		_ = ns.Do(func() error { panic("boom") })
	}()
	if n := threadsIn(t, ns.ID()); n != 0 {
		t.Fatalf("%d threads left in the namespace after a panic in Do", n)
	}
}

// If the switch back fails the thread must never run Go code again: Do leaves
// it locked, and the runtime terminates it when the goroutine exits (or, if it
// was the main thread, parks it for good).
func TestDoDiscardsThreadWhenRestoreFails(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "a")
	// Take the process's namespace before Do: if the stuck thread turns out
	// to be the main thread, /proc/self/ns/net (the thread-group leader's)
	// names the target namespace afterwards.
	root := rootID(t)
	netns.SetRestoreForTest(ns.Handle, func(int) error { return unix.EPERM })
	var tid int
	err := ns.Do(func() error { tid = unix.Gettid(); return nil })
	if !errors.Is(err, netns.ErrRestore) || !errors.Is(err, unix.EPERM) {
		t.Fatalf("Do = %v, want ErrRestore wrapping EPERM", err)
	}
	if tid != os.Getpid() {
		// The thread exits asynchronously after the goroutine returns.
		testkit.Eventually(t, 10*time.Second, fmt.Sprintf("thread %d stuck in the target namespace to be discarded", tid),
			func() bool { return threadsIn(t, ns.ID()) == 0 })
	}
	// Whichever thread it was, no goroutine may run in that namespace again.
	errc := make(chan error, 64)
	for range cap(errc) {
		go func() {
			h, err := netns.Current()
			if err == nil && h.ID() != root {
				err = fmt.Errorf("a goroutine ran in %v, want %v", h.ID(), root)
			}
			h.Close()
			errc <- err
		}()
	}
	for range cap(errc) {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func TestListenIsIsolatedAndMarked(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "a")
	ctx := context.Background()
	opts := netns.SockOpts{Mark: 1337, ReusePort: true}
	ln, err := ns.Listen(ctx, netip.MustParseAddrPort("127.0.0.1:0"), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	assertSockopt(t, ln.(*net.TCPListener), unix.SOL_SOCKET, unix.SO_MARK, 1337)
	assertSockopt(t, ln.(*net.TCPListener), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)

	// The port is free in the root namespace: the listener is not there.
	rootLn, err := net.Listen("tcp", addr.String())
	if err != nil {
		t.Fatalf("port %v taken in the root namespace too: %v", addr, err)
	}
	rootLn.Close()
	if c, err := net.Dial("tcp", addr.String()); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial %v from the root namespace = %v, want ECONNREFUSED", addr, err)
	}

	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	c, err := ns.Dial(ctx, "tcp", addr, netns.SockOpts{Mark: 42})
	if err != nil {
		t.Fatalf("dial %v inside the namespace: %v", addr, err)
	}
	defer c.Close()
	assertSockopt(t, c.(*net.TCPConn), unix.SOL_SOCKET, unix.SO_MARK, 42)
	assertSockopt(t, c.(*net.TCPConn), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	sc, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer sc.Close()
	if sc.RemoteAddr().String() != c.LocalAddr().String() {
		t.Fatalf("accepted %v, dialed from %v", sc.RemoteAddr(), c.LocalAddr())
	}
	assertSockopt(t, sc.(*net.TCPConn), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
}

// TestListenKeepAliveInherited: Listen sets keep-alive on the listening
// socket only, and every accepted connection has it, with Go's listener
// defaults, as when Go set it on each connection itself.
func TestListenKeepAliveInherited(t *testing.T) {
	var h *netns.Handle // the current namespace: no root needed
	ln, err := h.Listen(context.Background(), netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for i := range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		sc, err := ln.Accept()
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		tc := sc.(*net.TCPConn)
		t.Logf("connection %d", i)
		assertSockopt(t, tc, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
		assertSockopt(t, tc, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15)
		assertSockopt(t, tc, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15)
		assertSockopt(t, tc, unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9)
		assertSockopt(t, tc, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		sc.Close()
	}
}

// Transparent sockets may bind addresses the namespace does not own, which is
// how ztunnel keeps the original client IP towards the app.
func TestTransparentBindsForeignAddress(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "a")
	ctx := context.Background()
	for _, tc := range []struct {
		addr  string
		level int
		names []int
	}{
		{"192.0.2.1:0", unix.IPPROTO_IP, []int{unix.IP_TRANSPARENT, unix.IP_FREEBIND}},
		{"[2001:db8::1]:0", unix.IPPROTO_IPV6, []int{unix.IPV6_TRANSPARENT, unix.IPV6_FREEBIND}},
	} {
		addr := netip.MustParseAddrPort(tc.addr)
		if pc, err := ns.ListenPacket(ctx, addr, netns.SockOpts{}); !errors.Is(err, unix.EADDRNOTAVAIL) {
			if pc != nil {
				pc.Close()
			}
			t.Fatalf("plain bind %v = %v, want EADDRNOTAVAIL", addr, err)
		}
		pc, err := ns.ListenPacket(ctx, addr, netns.SockOpts{Transparent: true, Mark: 7})
		if err != nil {
			t.Fatalf("transparent bind %v: %v", addr, err)
		}
		for _, name := range tc.names {
			assertSockopt(t, pc, tc.level, name, 1)
		}
		assertSockopt(t, pc, unix.SOL_SOCKET, unix.SO_MARK, 7)
		pc.Close()
	}
}

func current(t *testing.T) *netns.Handle {
	t.Helper()
	h, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// rootID is the namespace the process's goroutines run in. It reads the
// calling thread's namespace, not /proc/self (the main thread's): an earlier
// test may have stranded the main thread in a test namespace on purpose.
func rootID(t *testing.T) netns.ID {
	h, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	return h.ID()
}

// threadsIn counts this process's threads whose netns is id.
func threadsIn(t *testing.T, id netns.ID) int {
	t.Helper()
	paths, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			continue // thread exited meanwhile
		}
		if (netns.ID{Dev: st.Dev, Ino: st.Ino}) == id {
			n++
		}
	}
	return n
}

func assertSockopt(t *testing.T, c syscall.Conn, level, name, want int) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var gerr error
	if err := rc.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), level, name) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil || got != want {
		t.Fatalf("getsockopt(%d, %d) = %d, %v; want %d", level, name, got, gerr, want)
	}
}

// BenchmarkDial measures one connection from inside a pod-like namespace to a
// listener in it, the node proxy's per-connection cost of entering the pod;
// "current" is the same dial without a namespace (a nil Handle), the floor.
// In the "reply" cases the dialer waits for one byte from the server before
// closing, as a proxied connection waits for its peer: a loopback connect
// completes without blocking, so the plain loop never lets other goroutines
// (the pool's refill) run on its thread.
func BenchmarkDial(b *testing.B) {
	roottest.Require(b)
	ns := netnstest.New(b, "bench")
	for _, bc := range []struct {
		name  string
		h     *netns.Handle
		reply bool
	}{{"pod", ns.Handle, false}, {"current", nil, false}, {"pod-reply", ns.Handle, true}, {"current-reply", nil, true}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			ln, err := bc.h.Listen(ctx, netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					if bc.reply {
						c.Write([]byte{1})
					}
					c.Close()
				}
			}()
			addr := ln.Addr().(*net.TCPAddr).AddrPort()
			var buf [1]byte
			b.ReportAllocs()
			cpu := cpuMeter(b)
			for b.Loop() {
				c, err := bc.h.Dial(ctx, "tcp", addr, netns.SockOpts{Mark: 1337})
				if err != nil {
					b.Fatal(err)
				}
				if bc.reply {
					if _, err := c.Read(buf[:]); err != nil {
						b.Fatal(err)
					}
				}
				c.Close()
			}
			cpu.report()
		})
	}
}

// BenchmarkSocket measures only what entering the namespace costs per dial:
// making the socket there and closing it.
func BenchmarkSocket(b *testing.B) {
	roottest.Require(b)
	ns := netnstest.New(b, "bench")
	b.ReportAllocs()
	cpu := cpuMeter(b)
	for b.Loop() {
		fd, err := netns.SocketForTest(ns.Handle, false, false)
		if err != nil {
			b.Fatal(err)
		}
		unix.Close(fd)
	}
	cpu.report()
}

// cpuMeter reports the process's CPU time (user + system, all threads: the
// dial, the accept loop and any helper thread) per benchmark op as
// cpu-ns/op, next to the wall time ns/op, which on a shared machine says
// more about the scheduler than about the work.
func cpuMeter(b *testing.B) interface{ report() } {
	return &meter{b: b, start: cpuTime(b)}
}

type meter struct {
	b     *testing.B
	start time.Duration
}

func (m *meter) report() {
	m.b.StopTimer()
	m.b.ReportMetric(float64(cpuTime(m.b)-m.start)/float64(m.b.N), "cpu-ns/op")
}

func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Dial makes only the socket inside the namespace and connects from the
// caller's goroutine; these are the outcomes a dial can have.
func TestDialOutcomes(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "d")
	ctx := context.Background()
	for _, lo := range []string{"127.0.0.1", "[::1]"} {
		ln, err := ns.Listen(ctx, netip.MustParseAddrPort(lo+":0"), netns.SockOpts{})
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().(*net.TCPAddr).AddrPort()
		c, err := ns.Dial(ctx, "tcp", addr, netns.SockOpts{Mark: 5, LocalAddr: netip.AddrPortFrom(addr.Addr(), 0)})
		if err != nil {
			t.Fatalf("dial %v: %v", addr, err)
		}
		assertSockopt(t, c.(*net.TCPConn), unix.SOL_SOCKET, unix.SO_MARK, 5)
		assertSockopt(t, c.(*net.TCPConn), unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != addr {
			t.Errorf("remote address %v, want %v", got, addr)
		}
		sc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(sc, buf); err != nil || buf[0] != 'x' {
			t.Fatalf("read %q, %v", buf, err)
		}
		sc.Close()
		c.Close()
		ln.Close()

		// The listener is gone: the port refuses.
		if c, err := ns.Dial(ctx, "tcp", addr, netns.SockOpts{}); !errors.Is(err, syscall.ECONNREFUSED) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("dial closed port %v = %v, want ECONNREFUSED", addr, err)
		}
	}

	// A connect that never completes ends with its context: the namespace
	// drops every SYN to port 9.
	if err := ns.Do(func() error {
		out, err := exec.Command("iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "DROP").CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables: %v: %s", err, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if c, err := ns.Dial(dctx, "tcp", netip.MustParseAddrPort("127.0.0.1:9"), netns.SockOpts{}); !errors.Is(err, context.DeadlineExceeded) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("dial to a dropping port = %v, want DeadlineExceeded", err)
	}
	cctx, cancel2 := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel2)
	if c, err := ns.Dial(cctx, "tcp", netip.MustParseAddrPort("127.0.0.1:9"), netns.SockOpts{}); !errors.Is(err, context.Canceled) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("cancelled dial to a dropping port = %v, want Canceled", err)
	}

	// UDP: the socket is connected and carries datagrams in the namespace.
	pc, err := ns.ListenPacket(ctx, netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	uc, err := ns.Dial(ctx, "udp", pc.LocalAddr().(*net.UDPAddr).AddrPort(), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if _, err := uc.Write([]byte("u")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _, err := pc.ReadFrom(buf); err != nil || string(buf[:n]) != "u" {
		t.Fatalf("udp read %q, %v", buf[:n], err)
	}
}
