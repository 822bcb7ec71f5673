package zds_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// waitTimeout bounds every wait for an asynchronous event; it is a safety
// net for a hung test, never a measured assertion.
const waitTimeout = 10 * time.Second

type event struct {
	kind string // add, keep, del, snapshot
	uid  string
	info *zdsapi.WorkloadInfo
	ns   *netns.Handle
	seen []string
}

func (e event) String() string {
	if e.kind == "snapshot" {
		return fmt.Sprintf("snapshot%v", e.seen)
	}
	return e.kind + " " + e.uid
}

// recorder is a Handler that records events; it refuses adds of uids in
// nack with that reason.
type recorder struct {
	t      *testing.T
	events chan event
	mu     sync.Mutex
	nack   map[string]string
}

func newRecorder(t *testing.T) *recorder {
	return &recorder{t: t, events: make(chan event, 100), nack: map[string]string{}}
}

func (r *recorder) Add(uid string, info *zdsapi.WorkloadInfo, ns *netns.Handle) error {
	r.mu.Lock()
	reason := r.nack[uid]
	r.mu.Unlock()
	if reason != "" {
		ns.Close()
		return errors.New(reason)
	}
	r.t.Cleanup(func() { ns.Close() })
	r.events <- event{kind: "add", uid: uid, info: info, ns: ns}
	return nil
}

func (r *recorder) Keep(uid string) error {
	r.events <- event{kind: "keep", uid: uid}
	return nil
}

func (r *recorder) Del(uid string) error {
	r.events <- event{kind: "del", uid: uid}
	return nil
}

func (r *recorder) SnapshotSent(seen []string) error {
	r.events <- event{kind: "snapshot", seen: seen}
	return nil
}

func (r *recorder) next(t *testing.T) event {
	t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(waitTimeout):
		t.Fatal("no ZDS event arrived")
		return event{}
	}
}

// untilSnapshot collects events up to and including the next snapshot_sent.
func (r *recorder) untilSnapshot(t *testing.T) (got []event) {
	t.Helper()
	for {
		e := r.next(t)
		got = append(got, e)
		if e.kind == "snapshot" {
			return got
		}
	}
}

// pods is a Snapshotter over a mutable pod set; a nil handle is a pod
// whose netns is unknown.
type pods struct {
	mu   sync.Mutex
	uids []string
	ns   map[string]*netns.Handle
}

func newPods() *pods { return &pods{ns: map[string]*netns.Handle{}} }

func (p *pods) set(uid string, h *netns.Handle) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.ns[uid]; !ok {
		p.uids = append(p.uids, uid)
	}
	p.ns[uid] = h
}

func (p *pods) remove(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.ns, uid)
	p.uids = slices.DeleteFunc(p.uids, func(u string) bool { return u == uid })
}

func (p *pods) Snapshot() []zds.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []zds.Pod
	for _, uid := range p.uids {
		pod := zds.Pod{UID: uid, Info: &zdsapi.WorkloadInfo{Name: "name-" + uid, Namespace: "default", ServiceAccount: "sa"}}
		if h := p.ns[uid]; h != nil {
			f, err := zds.DupNetns(h.FD())
			if err != nil {
				panic(err)
			}
			pod.Netns = f
		}
		out = append(out, pod)
	}
	return out
}

func sockPath(t *testing.T) string {
	// t.TempDir() can exceed the 108-byte sun_path limit for long test names.
	dir, err := os.MkdirTemp("", "zds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "ztunnel.sock")
}

// startServer runs a Server until the test ends; it returns a stop func
// that waits for Serve to return.
func startServer(t *testing.T, path string, snap zds.Snapshotter) (*zds.Server, func()) {
	t.Helper()
	s, err := zds.Listen(zds.ServerConfig{Path: path, Snapshotter: snap, LivenessInterval: 10 * time.Millisecond, AcceptInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return s, stop
}

func startClient(t *testing.T, path string, h zds.Handler) (stop func()) {
	t.Helper()
	c, err := zds.NewClient(zds.ClientConfig{Path: path, Handler: h, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Client.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func summary(evs []event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.String())
	}
	return out
}

func selfNetns(t *testing.T) *netns.Handle {
	t.Helper()
	h, err := netns.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestAddWorkloadDeliversUsableNetns(t *testing.T) {
	roottest.Require(t)
	pod := netnstest.New(t, "pod")
	path := sockPath(t)
	srv, _ := startServer(t, path, newPods())
	rec := newRecorder(t)
	startClient(t, path, rec)
	if got := summary(rec.untilSnapshot(t)); !slices.Equal(got, []string{"snapshot[]"}) {
		t.Fatalf("initial snapshot %v, want empty", got)
	}

	info := &zdsapi.WorkloadInfo{Name: "app-1", Namespace: "default", ServiceAccount: "app"}
	if err := srv.AddWorkload(context.Background(), "uid-1", info, pod.FD()); err != nil {
		t.Fatalf("AddWorkload: %v", err)
	}
	e := rec.next(t)
	if e.kind != "add" || e.uid != "uid-1" || !proto.Equal(e.info, info) {
		t.Fatalf("got %v %v, want add uid-1 %v", e, e.info, info)
	}
	if e.ns.ID() != pod.ID() {
		t.Fatalf("received netns %v, want the pod's %v", e.ns.ID(), pod.ID())
	}

	// Enter the received namespace: a listener there must be invisible from
	// the root namespace (abstract unix sockets are per network namespace).
	addr := "@zds-test-" + pod.Name
	var ln net.Listener
	err := e.ns.Do(func() error {
		cur, err := netns.Current()
		if err != nil {
			return err
		}
		defer cur.Close()
		if cur.ID() != pod.ID() {
			return fmt.Errorf("inside Do the thread is in %v, want %v", cur.ID(), pod.ID())
		}
		ln, err = net.Listen("unix", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if c, err := net.Dial("unix", addr); err == nil {
		c.Close()
		t.Fatal("listener created in the received netns is reachable from the root netns")
	}
	err = e.ns.Do(func() error {
		c, err := net.Dial("unix", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("listener not reachable inside the received netns: %v", err)
	}
}

func TestAddWorkloadWithoutProxyFailsFast(t *testing.T) {
	srv, _ := startServer(t, sockPath(t), newPods())
	err := srv.AddWorkload(context.Background(), "uid-1", nil, selfNetns(t).FD())
	if !errors.Is(err, zds.ErrNoProxy) {
		t.Fatalf("AddWorkload with no proxy = %v, want ErrNoProxy", err)
	}
	if err := srv.DelWorkload(context.Background(), "uid-1"); err != nil {
		t.Fatalf("DelWorkload with no proxy = %v, want nil", err)
	}
}

func TestNackPropagatesToAddWorkload(t *testing.T) {
	path := sockPath(t)
	srv, _ := startServer(t, path, newPods())
	rec := newRecorder(t)
	rec.nack["uid-bad"] = "netns already in use by another pod"
	startClient(t, path, rec)
	rec.untilSnapshot(t)

	var nack *zds.NackError
	err := srv.AddWorkload(context.Background(), "uid-bad", nil, selfNetns(t).FD())
	if !errors.As(err, &nack) || nack.Reason != "netns already in use by another pod" {
		t.Fatalf("AddWorkload = %v, want the handler's NACK", err)
	}
	// A file that is not a netns is refused by the client itself.
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = srv.AddWorkload(context.Background(), "uid-file", nil, int(f.Fd()))
	if !errors.As(err, &nack) || !strings.Contains(nack.Reason, netns.ErrNotNetns.Error()) {
		t.Fatalf("AddWorkload(non-netns fd) = %v, want a NACK saying %q", err, netns.ErrNotNetns)
	}
	// A NACK leaves the connection in service.
	if n := srv.Connected(); n != 1 {
		t.Fatalf("Connected() = %d after NACKs, want 1", n)
	}
	if err := srv.AddWorkload(context.Background(), "uid-good", nil, selfNetns(t).FD()); err != nil {
		t.Fatalf("AddWorkload after NACK: %v", err)
	}
	if e := rec.next(t); e.kind != "add" || e.uid != "uid-good" {
		t.Fatalf("got %v, want add uid-good", e)
	}
}

func TestAddGoesToNewestDelToAll(t *testing.T) {
	path := sockPath(t)
	srv, _ := startServer(t, path, newPods())
	old, newer := newRecorder(t), newRecorder(t)
	startClient(t, path, old)
	old.untilSnapshot(t)
	startClient(t, path, newer)
	newer.untilSnapshot(t)
	if n := srv.Connected(); n != 2 {
		t.Fatalf("Connected() = %d, want 2", n)
	}

	if err := srv.AddWorkload(context.Background(), "uid-1", nil, selfNetns(t).FD()); err != nil {
		t.Fatal(err)
	}
	if e := newer.next(t); e.kind != "add" || e.uid != "uid-1" {
		t.Fatalf("newest proxy got %v, want add uid-1", e)
	}
	if err := srv.DelWorkload(context.Background(), "uid-1"); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*recorder{"old": old, "newer": newer} {
		if e := r.next(t); e.kind != "del" || e.uid != "uid-1" {
			t.Fatalf("%s proxy got %v, want del uid-1 (the add must not have reached it)", name, e)
		}
	}
}

func TestSnapshotAfterProxyReconnect(t *testing.T) {
	roottest.Require(t)
	nsA, nsC := netnstest.New(t, "a"), netnstest.New(t, "c")
	path := sockPath(t)
	state := newPods()
	state.set("uid-a", nsA.Handle)
	state.set("uid-b", nil) // netns unknown: keep
	srv, _ := startServer(t, path, state)

	rec := newRecorder(t)
	stop := startClient(t, path, rec)
	got := rec.untilSnapshot(t)
	if s := summary(got); !slices.Equal(s, []string{"add uid-a", "keep uid-b", "snapshot[uid-a uid-b]"}) {
		t.Fatalf("first snapshot %v", s)
	}
	if got[0].ns.ID() != nsA.ID() {
		t.Fatalf("uid-a netns %v, want %v", got[0].ns.ID(), nsA.ID())
	}
	stop()
	testkit.Eventually(t, waitTimeout, "the server to notice the proxy left", func() bool { return srv.Connected() == 0 })

	state.remove("uid-a")
	state.set("uid-c", nsC.Handle)
	connected := srv.ProxyConnected()
	startClient(t, path, rec)
	got = rec.untilSnapshot(t)
	if s := summary(got); !slices.Equal(s, []string{"keep uid-b", "add uid-c", "snapshot[uid-b uid-c]"}) {
		t.Fatalf("snapshot after reconnect %v", s)
	}
	if got[1].ns.ID() != nsC.ID() {
		t.Fatalf("uid-c netns %v, want %v", got[1].ns.ID(), nsC.ID())
	}
	select {
	case <-connected:
	case <-time.After(waitTimeout):
		t.Fatal("ProxyConnected not signalled")
	}
}

func TestClientReconnectsAfterAgentRestart(t *testing.T) {
	path := sockPath(t)
	first := newPods()
	first.set("uid-1", nil)
	_, stopServer := startServer(t, path, first)
	rec := newRecorder(t)
	startClient(t, path, rec)
	if s := summary(rec.untilSnapshot(t)); !slices.Equal(s, []string{"keep uid-1", "snapshot[uid-1]"}) {
		t.Fatalf("first snapshot %v", s)
	}
	stopServer()

	second := newPods()
	second.set("uid-2", nil)
	srv2, _ := startServer(t, path, second)
	if s := summary(rec.untilSnapshot(t)); !slices.Equal(s, []string{"keep uid-2", "snapshot[uid-2]"}) {
		t.Fatalf("snapshot from the restarted agent %v", s)
	}
	if n := srv2.Connected(); n != 1 {
		t.Fatalf("restarted agent has %d proxies, want 1", n)
	}
}

// fakeAgent accepts one raw connection from a Client and checks its hello.
func fakeAgent(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ln.SetDeadline(time.Now().Add(waitTimeout))
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, zds.MaxMessageSize)
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	hello := &zdsapi.ZdsHello{}
	if err := proto.Unmarshal(buf[:n], hello); err != nil || hello.GetVersion() != zdsapi.Version_V1 {
		t.Fatalf("hello = %v, %v", hello, err)
	}
	return c
}

// send writes a raw datagram with fds and returns the ack's error text.
func send(t *testing.T, c *net.UnixConn, b []byte, fds ...int) string {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, zds.MaxMessageSize)
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		t.Fatalf("waiting for ack: %v", err)
	}
	resp := &zdsapi.WorkloadResponse{}
	if err := proto.Unmarshal(buf[:n], resp); err != nil || resp.GetAck() == nil {
		t.Fatalf("response %v, %v: not an ack", resp, err)
	}
	return resp.GetAck().GetError()
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClientRejectsBadMessagesAndStaysUp(t *testing.T) {
	path := sockPath(t)
	rec := newRecorder(t)
	startClient(t, path, rec)
	agent := fakeAgent(t, path)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	self := selfNetns(t)
	add := mustMarshal(t, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Add{Add: &zdsapi.AddWorkload{Uid: "uid-1"}}})
	keep := mustMarshal(t, &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: "uid-k"}}})

	before := openFDs(t)
	for _, tc := range []struct {
		name string
		msg  []byte
		fds  []int
		want string // substring of the NACK
	}{
		{"add with two fds", add, []int{self.FD(), int(r.Fd())}, "exactly 1"},
		{"add without fd", add, nil, "exactly 1"},
		{"keep with an fd", keep, []int{int(w.Fd())}, "want none"},
		{"garbage", []byte{0xff, 0xff, 0xff, 0xff}, nil, "decode request"},
		{"oversized datagram", make([]byte, 2*zds.MaxMessageSize), nil, "truncated"},
	} {
		if got := send(t, agent, tc.msg, tc.fds...); !strings.Contains(got, tc.want) {
			t.Errorf("%s: ack %q, want a NACK containing %q", tc.name, got, tc.want)
		}
	}
	if after := openFDs(t); after != before {
		t.Errorf("open fds %d -> %d: the client leaked received descriptors", before, after)
	}
	// The connection still works.
	if got := send(t, agent, keep); got != "" {
		t.Fatalf("valid keep after bad messages: NACK %q", got)
	}
	if e := rec.next(t); e.kind != "keep" || e.uid != "uid-k" {
		t.Fatalf("got %v, want keep uid-k", e)
	}
}

// fakeProxy connects to a Server, says hello (with version v) and returns
// the raw connection.
func fakeProxy(t *testing.T, path string, v zdsapi.Version) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, _, err := c.WriteMsgUnix(mustMarshal(t, &zdsapi.ZdsHello{Version: v}), nil, nil); err != nil {
		t.Fatal(err)
	}
	return c
}

// recvRequest reads one request from the server, closing any fds.
func recvRequest(t *testing.T, c *net.UnixConn) *zdsapi.WorkloadRequest {
	t.Helper()
	buf, oob := make([]byte, zds.MaxMessageSize), make([]byte, 128)
	c.SetReadDeadline(time.Now().Add(waitTimeout))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for i := range msgs {
			fds, _ := unix.ParseUnixRights(&msgs[i])
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}
	req, err := zds.DecodeRequest(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestServerSurvivesBadProxies(t *testing.T) {
	path := sockPath(t)
	srv, _ := startServer(t, path, newPods())
	ackOK := mustMarshal(t, &zdsapi.WorkloadResponse{Payload: &zdsapi.WorkloadResponse_Ack{Ack: &zdsapi.Ack{}}})

	for _, tc := range []struct {
		name  string
		reply []byte
		want  error
	}{
		{"garbage ack", []byte{0xff, 0xff, 0xff}, zds.ErrProtocol},
		{"wrong message", []byte{0x08, 0x01}, zds.ErrProtocol}, // a hello where an ack belongs
		{"oversized ack", make([]byte, 2*zds.MaxMessageSize), zds.ErrTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fakeProxy(t, path, zdsapi.Version_V1)
			if req := recvRequest(t, p); req.GetSnapshotSent() == nil {
				t.Fatalf("got %v, want snapshot_sent", req)
			}
			if _, _, err := p.WriteMsgUnix(ackOK, nil, nil); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, waitTimeout, "the proxy to register", func() bool { return srv.Connected() == 1 })
			errc := make(chan error, 1)
			go func() { errc <- srv.AddWorkload(context.Background(), "uid-1", nil, selfNetns(t).FD()) }()
			if req := recvRequest(t, p); req.GetAdd().GetUid() != "uid-1" {
				t.Fatalf("got %v, want add uid-1", req)
			}
			if _, _, err := p.WriteMsgUnix(tc.reply, nil, nil); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; !errors.Is(err, tc.want) {
				t.Fatalf("AddWorkload = %v, want %v", err, tc.want)
			}
			if n := srv.Connected(); n != 0 {
				t.Fatalf("broken connection kept: Connected() = %d", n)
			}
		})
	}

	// A bad hello is refused; a good proxy still gets served afterwards.
	bad := fakeProxy(t, path, zdsapi.Version_NOT_USED)
	bad.SetReadDeadline(time.Now().Add(waitTimeout))
	if n, _, _, _, err := bad.ReadMsgUnix(make([]byte, 64), nil); err == nil && n > 0 {
		t.Fatalf("server answered a bad hello with %d bytes", n)
	}
	rec := newRecorder(t)
	startClient(t, path, rec)
	if s := summary(rec.untilSnapshot(t)); !slices.Equal(s, []string{"snapshot[]"}) {
		t.Fatalf("snapshot %v", s)
	}
}

func TestAckTimeoutDropsConnection(t *testing.T) {
	path := sockPath(t)
	srv, err := zds.Listen(zds.ServerConfig{Path: path, Snapshotter: newPods(), AckTimeout: 50 * time.Millisecond, AcceptInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()

	p := fakeProxy(t, path, zdsapi.Version_V1)
	recvRequest(t, p) // snapshot_sent, never acked
	testkit.Eventually(t, waitTimeout, "the unanswered snapshot to drop the proxy", func() bool {
		// The proxy sees EOF once the server gave up.
		p.SetReadDeadline(time.Now().Add(time.Millisecond))
		n, _, _, _, err := p.ReadMsgUnix(make([]byte, 64), nil)
		var ne net.Error
		return n == 0 && !(errors.As(err, &ne) && ne.Timeout())
	})
	if n := srv.Connected(); n != 0 {
		t.Fatalf("Connected() = %d, want 0", n)
	}
}
