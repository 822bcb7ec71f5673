package meshlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// DNSNamespace and DNSPodName name the topology's upstream DNS server pod.
const (
	DNSNamespace = "kube-system"
	DNSPodName   = "coredns"
)

// ServeEcho runs an echo server on TCP port of pod p (all addresses) until
// the mesh is torn down: every connection gets back what it sends, and a
// half-close is passed on once everything was echoed.
func (m *Mesh) ServeEcho(p *testcluster.Pod, port int) error {
	ln, err := p.Listen(fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("meshlab: echo on %s/%s:%d: %w", p.Namespace, p.Name, port, err)
	}
	m.mu.Lock()
	m.apps = append(m.apps, ln)
	m.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}()
		}
	}()
	return nil
}

// startDNS creates the DNS pod (wired outside the mesh) and serves
// Options.DNS on its IP, port 53, UDP and TCP.
func (m *Mesh) startDNS(ctx context.Context) error {
	p, err := m.Cluster.Node(0).AddPod(ctx, testcluster.PodSpec{Name: DNSPodName, Namespace: DNSNamespace, Uncaptured: true})
	if err != nil {
		return err
	}
	m.DNSPod = p
	m.mu.Lock()
	m.pods[DNSNamespace+"/"+DNSPodName] = p
	m.mu.Unlock()
	names := map[string]netip.Addr{}
	for k, v := range m.opts.DNS {
		names[dns.CanonicalName(k)] = v
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		resp := new(dns.Msg)
		resp.SetReply(r)
		if len(r.Question) == 1 {
			q := r.Question[0]
			ip, ok := names[dns.CanonicalName(q.Name)]
			switch {
			case !ok:
				resp.Rcode = dns.RcodeNameError
			case q.Qtype == dns.TypeA && ip.Is4():
				resp.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: ip.AsSlice()}}
			}
		}
		_ = w.WriteMsg(resp)
	})
	addr := netip.AddrPortFrom(p.IP, 53).String()
	pc, err := p.ListenPacket(addr)
	if err != nil {
		return fmt.Errorf("meshlab: DNS server: %w", err)
	}
	ln, err := p.Listen(addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("meshlab: DNS server: %w", err)
	}
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go func() { _ = s.ActivateAndServe() }()
		<-started
		m.mu.Lock()
		m.apps = append(m.apps, closerFunc(func() error { return s.Shutdown() }))
		m.mu.Unlock()
	}
	return nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// etcNetns is where `ip netns exec NAME` finds files to bind-mount over
// /etc (resolv.conf) for processes in namespace NAME.
const etcNetns = "/etc/netns"

// writeNodeResolvConf points processes started in n's namespace at the
// topology's DNS server, and removes the file again at teardown.
func (m *Mesh) writeNodeResolvConf(n *testcluster.Node) error {
	dir := filepath.Join(etcNetns, n.NetNSName())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	m.tb.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove(etcNetns) // only if empty
	})
	conf := fmt.Sprintf("# meshlab: the topology's DNS server (pod %s/%s)\nnameserver %s\nsearch svc.cluster.local cluster.local\n",
		DNSNamespace, DNSPodName, m.DNSPod.IP)
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	return nil
}

// DNSQuery sends one query for name (type qtype) from inside pod p to
// server over proto ("udp" or "tcp"), as an application in the pod would:
// with DNS capture on, the pod's rules hand it to the node proxy.
func DNSQuery(ctx context.Context, p *testcluster.Pod, proto string, server netip.AddrPort, name string, qtype uint16) (*dns.Msg, error) {
	conn, err := p.Dial(ctx, proto, server.String())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	dc := &dns.Conn{Conn: conn}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	if err := dc.WriteMsg(q); err != nil {
		return nil, fmt.Errorf("meshlab: DNS query %s: %w", name, err)
	}
	r, err := dc.ReadMsg()
	if err != nil {
		return nil, fmt.Errorf("meshlab: DNS query %s via %s: %w", name, server, err)
	}
	return r, nil
}

// FirstA returns the first A record of r.
func FirstA(r *dns.Msg) (netip.Addr, error) {
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			return ip, nil
		}
	}
	return netip.Addr{}, errors.New("meshlab: no A record in the answer")
}
