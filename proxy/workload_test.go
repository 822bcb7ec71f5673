package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/conntrace"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// podEnv is one network namespace standing in for a pod: the pod's IP
// 10.55.0.1 and an outside address 10.55.0.2 on lo, an app on each, an
// iptables REDIRECT of TCP to 10.55.0.2 to 15001 (unless marked), and a
// WorkloadProxy serving the pod.
type podEnv struct {
	ns    *netnstest.NS
	store *state.Store
	certs *identity.StaticSource
	ca    *ca.CA
	proxy *WorkloadProxy
	logs  *observer.ObservedLogs
	reg   *prometheus.Registry
	id    identity.Identity
}

var (
	podIP     = netip.MustParseAddr("10.55.0.1")
	outsideIP = netip.MustParseAddr("10.55.0.2")
)

func newPodEnv(t *testing.T) *podEnv { return newPodEnvWith(t, nil) }

// newPodEnvWith is newPodEnv with the proxy's connection spans going to tr.
func newPodEnvWith(t *testing.T, tr *conntrace.Tracer) *podEnv {
	roottest.Require(t)
	ns := netnstest.New(t, "pod")
	netnstest.IP(t, "-n", ns.Name, "addr", "add", podIP.String()+"/32", "dev", "lo")
	netnstest.IP(t, "-n", ns.Name, "addr", "add", outsideIP.String()+"/32", "dev", "lo")
	ns.Exec(t, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", outsideIP.String()+"/32",
		"-m", "mark", "!", "--mark", "0x539/0xfff", "-j", "REDIRECT", "--to-ports", "15001")
	for _, ap := range []netip.AddrPort{netip.AddrPortFrom(podIP, 8080), netip.AddrPortFrom(outsideIP, 9090)} {
		ln, err := ns.Listen(context.Background(), ap, netns.SockOpts{})
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
					fmt.Fprintf(c, "app %s from %s\n", c.LocalAddr(), c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
					io.Copy(c, c)
				}()
			}
		}()
	}
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &podEnv{ns: ns, store: state.NewStore(), certs: identity.NewStaticSource(), ca: authority,
		id: identity.MustNew("cluster.local", "apps", "sa-pod")}
	e.issue(t, e.id)
	e.issue(t, identity.MustNew("cluster.local", "apps", "peer"))
	pt.Apply(t, e.store, pt.Pod("apps", "pod", podIP.String()))
	core, logs := observer.New(zap.InfoLevel)
	e.logs = logs
	e.reg = prometheus.NewRegistry()
	p, err := NewWorkloadProxy(&Deps{
		Store: e.store, Certs: e.certs, Metrics: NewMetrics(e.reg), Log: zap.New(core),
		Config: &config.Config{NodeName: "node0", TrustDomain: "cluster.local", PacketMark: 1337,
			InpodPortReuse: true, IPv6Enabled: true, EnableOrigSrc: true},
		Tracer: tr,
	}, WorkloadInfo{Name: "pod", Namespace: "apps", ServiceAccount: "sa-pod"}, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	e.proxy = p
	done := make(chan error, 1)
	go func() { done <- p.Serve(context.Background()) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return e
}

func (e *podEnv) issue(t *testing.T, id identity.Identity) {
	wc, err := e.ca.Issue(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e.certs.Set(wc)
}

// connect sends one CONNECT to the pod's 15008 as peer.
func (e *podEnv) connect(t *testing.T, authority string) (*hbone.Tunnel, error) {
	return e.connectReq(t, &hbone.ConnectRequest{Authority: netip.MustParseAddrPort(authority)})
}

// connectReq sends req to the pod's 15008 as peer.
func (e *podEnv) connectReq(t *testing.T, req *hbone.ConnectRequest) (*hbone.Tunnel, error) {
	cc, err := hbone.Dial(context.Background(), &hbone.ClientConfig{
		Certs: e.certs,
		Dial: func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
			return e.ns.Dial(ctx, "tcp", hop, netns.SockOpts{Mark: 1337})
		},
	}, hbone.Key{
		Src: identity.MustNew("cluster.local", "apps", "peer"), Dst: []identity.Identity{e.id},
		NextHop: netip.AddrPortFrom(podIP, route.HBONEPort),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return cc.Connect(ctx, req)
}

// TestInboundHBONEStatus checks the answer to each kind of CONNECT and
// that the tunnel carries bytes only after the app is connected.
func TestInboundHBONEStatus(t *testing.T) {
	e := newPodEnv(t)
	pt.ApplyPolicies(t, e.store, pt.Policy("apps", "deny-9999", securityapi.Action_DENY, pt.Rule(pt.Ports(9999))))
	for _, tc := range []struct {
		name      string
		authority string
		status    int // 0: 200
		reason    string
	}{
		{"the pod's app", "10.55.0.1:8080", 0, ""},
		{"another IP than the arrival one", "10.55.0.2:9090", 400, "bad_request"},
		{"a proxy port", "10.55.0.1:15001", 503, "self_call"},
		{"denied by policy", "10.55.0.1:9999", 401, "policy_denied"},
		{"nothing listening", "10.55.0.1:8081", 503, "connect_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tun, err := e.connect(t, tc.authority)
			if tc.status == 0 {
				if err != nil {
					t.Fatal(err)
				}
				defer tun.Close()
				line := make([]byte, 64)
				n, _ := tun.Read(line)
				// Source and destination are the same pod: not spoofed.
				if want := "app 10.55.0.1:8080 from 10.55.0.1"; !strings.HasPrefix(string(line[:n]), want) {
					t.Fatalf("tunnel read %q, want %q", line[:n], want)
				}
				return
			}
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != tc.status {
				t.Fatalf("err = %v, want status %d", err, tc.status)
			}
			waitLog(t, e.logs, map[string]string{"direction": "inbound", "reason": tc.reason, "dst.hbone_addr": tc.authority})
		})
	}
}

// TestOutboundOriginalDst shows the 15001 listener recovering the original
// destination of a REDIRECTed connection (on its dual-stack socket) and
// passing unknown destinations through from inside the pod.
func TestOutboundOriginalDst(t *testing.T) {
	e := newPodEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.ns.Dial(ctx, "tcp", netip.AddrPortFrom(outsideIP, 9090), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line := make([]byte, 64)
	n, err := c.Read(line)
	if err != nil || !strings.HasPrefix(string(line[:n]), "app 10.55.0.2:9090 from ") {
		t.Fatalf("read %q (%v), want the outside app", line[:n], err)
	}
	c.Close()
	waitLog(t, e.logs, map[string]string{"direction": "outbound", "dst.addr": "10.55.0.2:9090", "src.workload": "pod"})
}

// TestDrainRefusesNewKeepsOld drains the pod with a connection open: the
// listeners close at once, the open tunnel keeps working until it ends.
func TestDrainRefusesNewKeepsOld(t *testing.T) {
	e := newPodEnv(t)
	tun, err := e.connect(t, "10.55.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := tun.Read(buf); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	go func() {
		e.proxy.Drain(context.Background(), 10*time.Second)
		close(drained)
	}()
	// The open tunnel still echoes while the drain waits for it.
	if _, err := io.WriteString(tun, "still here"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(tun, buf[:10]); err != nil || string(buf[:10]) != "still here" {
		t.Fatalf("echo during drain: %q (%v)", buf[:10], err)
	}
	select {
	case <-drained:
		t.Fatal("Drain returned while a connection was open")
	default:
	}
	tun.CloseWrite()
	io.Copy(io.Discard, tun)
	<-drained
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c, err := e.ns.Dial(ctx, "tcp", netip.AddrPortFrom(podIP, route.HBONEPort), netns.SockOpts{}); err == nil {
		c.Close()
		t.Fatal("15008 still accepts after Drain")
	}
	waitLog(t, e.logs, map[string]string{"direction": "inbound", "dst.hbone_addr": "10.55.0.1:8080", "bytes_sent": "10"})
}

func waitLog(t *testing.T, logs *observer.ObservedLogs, want map[string]string) {
	t.Helper()
	testkit.EventuallyErr(t, 5*time.Second, fmt.Sprintf("an access-log line with %v", want), func() error {
		for _, e := range logs.FilterMessage("connection complete").All() {
			f := e.ContextMap()
			ok := true
			for k, v := range want {
				if v == "" {
					if _, has := f[k]; has {
						ok = false
					}
				} else if fmt.Sprint(f[k]) != v {
					ok = false
				}
			}
			if ok {
				return nil
			}
		}
		var all []string
		for _, e := range logs.All() {
			all = append(all, fmt.Sprint(e.Message, e.ContextMap()))
		}
		return fmt.Errorf("have:\n%s", strings.Join(all, "\n"))
	})
}
