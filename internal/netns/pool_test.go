package netns_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Dials into two namespaces at once, many per namespace, more than the pool
// holds: every connection's socket belongs to the namespace it was dialled
// in (its netns cookie is that namespace's) and reaches the listener that
// exists only there, on the same address in both.
func TestDialPoolConcurrentNamespaces(t *testing.T) {
	roottest.Require(t)
	ctx := context.Background()
	type target struct {
		ns     *netnstest.NS
		cookie uint64
		addr   netip.AddrPort
		tag    byte
	}
	var targets []target
	port := uint16(0)
	for i, name := range []string{"a", "b"} {
		ns := netnstest.New(t, name)
		ln, err := ns.Listen(ctx, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), netns.SockOpts{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		port = ln.Addr().(*net.TCPAddr).AddrPort().Port() // b listens on a's port
		tag := byte('a' + i)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte{tag})
				c.Close()
			}
		}()
		targets = append(targets, target{ns, cookieOf(t, ns.Handle), ln.Addr().(*net.TCPAddr).AddrPort(), tag})
	}
	if targets[0].cookie == targets[1].cookie || targets[0].cookie == cookieOf(t, nil) {
		t.Fatalf("namespace cookies not distinct: %d %d", targets[0].cookie, targets[1].cookie)
	}
	const workers, dials = 8, 3 * netns.PoolDepth
	errc := make(chan error, 2*workers)
	for _, tg := range targets {
		for range workers {
			go func() {
				for range dials {
					c, err := tg.ns.Dial(ctx, "tcp", tg.addr, netns.SockOpts{Mark: 7})
					if err != nil {
						errc <- err
						return
					}
					got := fdCookie(t, c.(*net.TCPConn))
					var buf [1]byte
					_, rerr := io.ReadFull(c, buf[:])
					c.Close()
					switch {
					case got != tg.cookie:
						errc <- errors.New("socket made outside the namespace it was dialled in")
						return
					case rerr != nil || buf[0] != tg.tag:
						errc <- errors.New("connected to the other namespace's listener")
						return
					}
				}
				errc <- nil
			}()
		}
	}
	for range cap(errc) {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for _, tg := range targets {
		testkit.Eventually(t, 5*time.Second, "pool refilled", func() bool {
			return !netns.RefillingForTest(tg.ns.Handle) && netns.PooledForTest(tg.ns.Handle) > 0
		})
		if n := threadsIn(t, tg.ns.ID()); n != 0 {
			t.Fatalf("%d threads left in %s: the pool must not keep one", n, tg.ns.Name)
		}
	}
}

// Every socket the pool hands out, IPv4 and IPv6, TCP and UDP, is of the kind
// asked for and in the namespace.
func TestDialPoolKinds(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "k")
	ctx := context.Background()
	want := cookieOf(t, ns.Handle)
	for _, tc := range []struct{ network, addr string }{
		{"tcp", "127.0.0.1"}, {"tcp", "::1"}, {"udp", "127.0.0.1"}, {"udp", "::1"},
	} {
		var addr netip.AddrPort
		switch tc.network {
		case "tcp":
			ln, err := ns.Listen(ctx, netip.AddrPortFrom(netip.MustParseAddr(tc.addr), 0), netns.SockOpts{})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			addr = ln.Addr().(*net.TCPAddr).AddrPort()
		case "udp":
			pc, err := ns.ListenPacket(ctx, netip.AddrPortFrom(netip.MustParseAddr(tc.addr), 0), netns.SockOpts{})
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
		}
		for i := range 2 * netns.PoolDepth {
			c, err := ns.Dial(ctx, tc.network, addr, netns.SockOpts{})
			if err != nil {
				t.Fatalf("%s %v dial %d: %v", tc.network, addr, i, err)
			}
			sc := c.(syscall.Conn)
			if got := fdCookie(t, sc); got != want {
				t.Fatalf("%s %v dial %d: socket in netns cookie %d, want %d", tc.network, addr, i, got, want)
			}
			if got := c.RemoteAddr().String(); got != addr.String() {
				t.Fatalf("%s dial %d: remote %s, want %v", tc.network, i, got, addr)
			}
			c.Close()
			if i == 0 {
				testkit.Eventually(t, 5*time.Second, "pool of "+tc.network+" "+tc.addr+" refilled",
					func() bool { return !netns.RefillingForTest(ns.Handle) && netns.PooledForTest(ns.Handle) > 0 })
			}
		}
	}
}

// An unused pool is closed after the idle timeout and refilled by the next
// dial; Close closes it at once, refuses new dials and leaves no socket open.
func TestDialPoolIdleAndClose(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "i")
	h, err := netns.Open("/var/run/netns/" + ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	netns.SetIdleForTest(h, 200*time.Millisecond)
	ctx := context.Background()
	ln, err := ns.Listen(ctx, netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	base := openSockets(t)
	dial := func() {
		t.Helper()
		c, err := h.Dial(ctx, "tcp", addr, netns.SockOpts{})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for range 2 {
		dial()
		testkit.Eventually(t, 5*time.Second, "pool filled", func() bool { return netns.PooledForTest(h) > 0 })
		testkit.Eventually(t, 5*time.Second, "idle pool closed", func() bool {
			return !netns.RefillingForTest(h) && netns.PooledForTest(h) == 0
		})
		noSocketsOver(t, base, "after the pool went idle")
	}

	dial()
	testkit.Eventually(t, 5*time.Second, "pool filled", func() bool {
		return !netns.RefillingForTest(h) && netns.PooledForTest(h) > 0
	})
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if n := netns.PooledForTest(h); n != 0 {
		t.Fatalf("%d sockets pooled after Close", n)
	}
	if c, err := h.Dial(ctx, "tcp", addr, netns.SockOpts{}); !errors.Is(err, netns.ErrClosed) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial after Close = %v, want ErrClosed", err)
	}
	if err := h.Do(func() error { return nil }); !errors.Is(err, netns.ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}
	if err := h.Close(); !errors.Is(err, netns.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	noSocketsOver(t, base, "after Close")
}

// Close while dials are under way: each dial either completes in the
// namespace or fails with ErrClosed, and once all have returned and their
// connections are closed no socket is left open.
func TestCloseDuringDials(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "c")
	h, err := netns.Open("/var/run/netns/" + ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ln, err := ns.Listen(ctx, netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	want := cookieOf(t, ns.Handle)
	base := openSockets(t)

	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	errc := make(chan error, 8)
	start := make(chan struct{})
	for range cap(errc) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				c, err := h.Dial(ctx, "tcp", addr, netns.SockOpts{})
				if errors.Is(err, netns.ErrClosed) {
					mu.Lock()
					refused++
					mu.Unlock()
					return
				}
				if err != nil {
					errc <- err
					return
				}
				got := fdCookie(t, c.(*net.TCPConn))
				c.Close()
				if got != want {
					errc <- errors.New("socket made outside the namespace")
					return
				}
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	close(start)
	time.Sleep(50 * time.Millisecond)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if ok == 0 || refused != 8 {
		t.Fatalf("%d dials completed, %d refused; want some and 8", ok, refused)
	}
	testkit.Eventually(t, 5*time.Second, "no refill running", func() bool { return !netns.RefillingForTest(h) })
	if n := netns.PooledForTest(h); n != 0 {
		t.Fatalf("%d sockets pooled after Close", n)
	}
	noSocketsOver(t, base, "after Close and the dials")
	if n := threadsIn(t, ns.ID()); n != 0 {
		t.Fatalf("%d threads left in the namespace", n)
	}
}

// A namespace whose name is deleted lives on while the Handle holds it:
// dials still make their sockets there (pooled or not) and reach its
// listener, never the process's namespace.
func TestDialAfterNamespaceDeleted(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "del")
	ctx := context.Background()
	ln, err := ns.Listen(ctx, netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("p"))
			c.Close()
		}
	}()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	want := cookieOf(t, ns.Handle)
	c, err := ns.Dial(ctx, "tcp", addr, netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	testkit.Eventually(t, 5*time.Second, "pool filled", func() bool {
		return !netns.RefillingForTest(ns.Handle) && netns.PooledForTest(ns.Handle) > 0
	})
	if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	for i := range 2 * netns.PoolDepth {
		c, err := ns.Dial(ctx, "tcp", addr, netns.SockOpts{})
		if err != nil {
			t.Fatalf("dial %d after the name was deleted: %v", i, err)
		}
		got := fdCookie(t, c.(*net.TCPConn))
		buf, rerr := io.ReadAll(c)
		c.Close()
		if got != want || rerr != nil || string(buf) != "p" {
			t.Fatalf("dial %d: cookie %d (want %d), read %q, %v", i, got, want, buf, rerr)
		}
	}
}

// A refill whose thread cannot switch back loses that thread, as Do does;
// no goroutine runs in the namespace afterwards and dials still work.
func TestRefillDiscardsThreadWhenRestoreFails(t *testing.T) {
	roottest.Require(t)
	ns := netnstest.New(t, "r")
	ctx := context.Background()
	root := rootID(t)
	ln, err := ns.Listen(ctx, netip.MustParseAddrPort("127.0.0.1:0"), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	dial := func() error {
		c, err := ns.Dial(ctx, "tcp", addr, netns.SockOpts{})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "pool filled", func() bool {
		return !netns.RefillingForTest(ns.Handle) && netns.PooledForTest(ns.Handle) > 0
	})
	netns.SetRestoreForTest(ns.Handle, func(int) error { return unix.EPERM })
	// Take the pool down past refillAt, so a refill starts; dials that
	// find it empty go through Do, which fails the same way.
	for range netns.PoolDepth {
		if err := dial(); err != nil && !errors.Is(err, netns.ErrRestore) {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 5*time.Second, "refill done", func() bool { return !netns.RefillingForTest(ns.Handle) })
	testkit.Eventually(t, 10*time.Second, "stuck threads discarded", func() bool {
		return threadsIn(t, ns.ID()) == 0 || threadsIn(t, ns.ID()) == 1 && mainThreadIn(t, ns.ID())
	})
	errc := make(chan error, 64)
	for range cap(errc) {
		go func() {
			h, err := netns.Current()
			if err == nil && h.ID() != root {
				err = errors.New("a goroutine ran in the test namespace")
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

// mainThreadIn says whether the process's main thread is in id (the runtime
// parks a locked main thread instead of ending it).
func mainThreadIn(t *testing.T, id netns.ID) bool {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join("/proc/self/task", strconv.Itoa(os.Getpid()), "ns/net"), &st); err != nil {
		t.Fatal(err)
	}
	return (netns.ID{Dev: st.Dev, Ino: st.Ino}) == id
}

// cookieOf is the netns cookie of h's namespace (nil: the process's), read
// from a socket made there by Do, not by the pool under test.
func cookieOf(t *testing.T, h *netns.Handle) uint64 {
	t.Helper()
	var cookie uint64
	err := h.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return cookie
}

func fdCookie(t *testing.T, c syscall.Conn) uint64 {
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cookie uint64
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cookie, gerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return cookie
}

// openSockets counts the process's open socket fds.
func openSockets(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// noSocketsOver fails unless the process's open sockets come back to base
// (the in-process server closes its side of each connection a moment after
// the dialler; a leaked socket never goes).
func noSocketsOver(t *testing.T, base int, when string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, "no socket left open "+when, func() bool { return openSockets(t) <= base })
}
