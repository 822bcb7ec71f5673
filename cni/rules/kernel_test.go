package rules

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
)

// Both variants are tested: whichever the node uses, the rules must read
// back as the same canonical text.
func modes(t *testing.T) []Mode {
	for _, bin := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found (apt package iptables): %v", bin, err)
		}
	}
	return []Mode{ModeLegacy, ModeNFT}
}

// backend is one way of putting a RuleSet into the kernel.
type backend struct {
	name string
	new  func(ns *netns.Handle) Applier
}

// backends are both iptables variants and native nftables: the capture
// cases run against each.
func backends(t *testing.T) []backend {
	var out []backend
	for _, m := range modes(t) {
		out = append(out, backend{"iptables-" + m.String(), func(ns *netns.Handle) Applier {
			return NewKernelApplier(KernelConfig{Netns: ns, Mode: m})
		}})
	}
	requireNFT(t)
	return append(out, backend{"nftables", func(ns *netns.Handle) Applier {
		return NewNFTApplier(NFTConfig{Netns: ns})
	}})
}

func requireNFT(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("nft not found (apt package nftables, make deps): %v", err)
	}
}

// topology: a "pod" namespace and a "peer" namespace joined by a veth.
//
//	pod  eth0 10.77.0.1/24 fd77::1/64
//	peer eth0 10.77.0.2/24 10.77.0.3/24 fd77::2/64 fd77::3/64
func topology(t *testing.T) (pod, peer *netnstest.NS) {
	pod = netnstest.New(t, "pod")
	peer = netnstest.New(t, "peer")
	netnstest.Veth(t, pod, "eth0", []string{"10.77.0.1/24", "fd77::1/64"},
		peer, "eth0", []string{"10.77.0.2/24", "10.77.0.3/24", "fd77::2/64", "fd77::3/64"})
	return pod, peer
}

// serveTCP answers every connection with reply and, for redirected
// connections, the original destination (IPv4 only).
func serveTCP(t *testing.T, ns *netnstest.NS, addr, reply string) {
	t.Helper()
	ln, err := ns.Listen(context.Background(), netip.MustParseAddrPort(addr), netns.SockOpts{})
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
			msg := reply
			if od, ok := originalDst(c); ok && od.String() != c.LocalAddr().String() {
				msg += " " + od.String()
			}
			io.WriteString(c, msg)
			c.Close()
		}
	}()
}

// originalDst reads SO_ORIGINAL_DST (IPv4).
func originalDst(c net.Conn) (netip.AddrPort, bool) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}, false
	}
	var sa *unix.IPv6Mreq // 20 bytes, large enough for a sockaddr_in
	var gerr error
	rc.Control(func(fd uintptr) { sa, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST) })
	if err != nil || gerr != nil {
		return netip.AddrPort{}, false
	}
	b := sa.Multiaddr
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4])), true
}

func serveUDP(t *testing.T, ns *netnstest.NS, addr, reply string) {
	t.Helper()
	pc, err := ns.ListenPacket(context.Background(), netip.MustParseAddrPort(addr), netns.SockOpts{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			pc.WriteToUDPAddrPort([]byte(reply), from)
		}
	}()
}

// exchange connects from ns to addr and returns what the server said, or the
// error text.
func exchange(ns *netnstest.NS, network, addr string, mark uint32) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.Dial(ctx, network, netip.MustParseAddrPort(addr), netns.SockOpts{Mark: mark})
	if err != nil {
		return "error: " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if network == "udp" {
		if _, err := c.Write([]byte("q")); err != nil {
			return "error: " + err.Error()
		}
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(buf[:n])
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

func TestKernelCapture(t *testing.T) {
	roottest.Require(t)
	for _, be := range backends(t) {
		t.Run(be.name, func(t *testing.T) {
			pod, peer := topology(t)
			// ztunnel's stand-ins in the pod.
			serveTCP(t, pod, "127.0.0.1:15001", "outbound")
			serveTCP(t, pod, "[::1]:15001", "outbound6")
			serveTCP(t, pod, "0.0.0.0:15006", "inbound")
			serveUDP(t, pod, "127.0.0.1:15053", "dns-proxy")
			serveTCP(t, pod, "0.0.0.0:8081", "app")
			// The peer answers everything itself.
			for _, addr := range []string{"[::]:8080", "0.0.0.0:9090"} {
				serveTCP(t, peer, addr, "peer")
			}
			// UDP servers bind each address: a wildcard socket would answer
			// from the primary address, which a connected client drops.
			serveUDP(t, peer, "10.77.0.2:53", "peer-dns")
			serveUDP(t, peer, "10.77.0.3:53", "peer-dns")
			serveUDP(t, peer, "10.77.0.2:5353", "peer-udp")

			a := be.new(pod.Handle)
			apply := func(s PodSettings) {
				t.Helper()
				if err := a.Apply(mustInPod(t, s)); err != nil {
					t.Fatal(err)
				}
			}
			type probe struct {
				from    *netnstest.NS
				network string
				addr    string
				mark    uint32
				want    string
			}
			check := func(probes []probe) {
				t.Helper()
				for _, p := range probes {
					if got := exchange(p.from, p.network, p.addr, p.mark); got != p.want {
						t.Errorf("%s %s (mark %d) from %s: got %q, want %q", p.network, p.addr, p.mark, p.from.Name, got, p.want)
					}
				}
			}

			apply(PodSettings{
				IPv6: true, DNSCapture: true,
				ExcludeOutboundPorts:    []uint16{9090},
				ExcludeOutboundIPRanges: prefixes("10.77.0.3/32", "fd77::3/128"),
				ExcludeInboundPorts:     []uint16{8081},
			})
			check([]probe{
				{pod, "tcp", "10.77.0.2:8080", 0, "outbound 10.77.0.2:8080"},
				{pod, "tcp", "[fd77::2]:8080", 0, "outbound6"},
				{pod, "tcp", "10.77.0.2:8080", ZtunnelMark, "peer"}, // ztunnel's own traffic
				{pod, "tcp", "10.77.0.2:9090", 0, "peer"},           // excluded port
				{pod, "tcp", "10.77.0.3:8080", 0, "peer"},           // excluded range
				{pod, "tcp", "[fd77::3]:8080", 0, "peer"},           // excluded range, IPv6
				{pod, "udp", "10.77.0.2:53", 0, "dns-proxy"},
				{pod, "udp", "10.77.0.3:53", 0, "peer-dns"},           // DNS server in an excluded range
				{pod, "udp", "10.77.0.2:53", ZtunnelMark, "peer-dns"}, // ztunnel's upstream query (CT zone 1)
				{pod, "udp", "10.77.0.2:5353", 0, "peer-udp"},         // other UDP is never captured
				{peer, "tcp", "10.77.0.1:8080", 0, "inbound 10.77.0.1:8080"},
				{peer, "tcp", "10.77.0.1:8081", 0, "app"}, // excluded inbound port
			})

			apply(PodSettings{IPv6: true}) // DNS capture off
			check([]probe{
				{pod, "udp", "10.77.0.2:53", 0, "peer-dns"},
				{pod, "tcp", "10.77.0.2:9090", 0, "outbound 10.77.0.2:9090"}, // exclusion gone
				{peer, "tcp", "10.77.0.1:8081", 0, "inbound 10.77.0.1:8081"},
			})

			apply(PodSettings{IPv6: true, DNSCapture: true, ExcludeOutboundPorts: []uint16{53}})
			check([]probe{
				{pod, "udp", "10.77.0.2:53", 0, "peer-dns"},
				{pod, "tcp", "10.77.0.2:8080", 0, "outbound 10.77.0.2:8080"},
			})

			if err := a.Remove(mustInPod(t, PodSettings{IPv6: true})); err != nil {
				t.Fatal(err)
			}
			check([]probe{
				{pod, "tcp", "10.77.0.2:8080", 0, "peer"},
				{pod, "udp", "10.77.0.2:53", 0, "peer-dns"},
				{peer, "tcp", "10.77.0.1:8081", 0, "app"},
			})
		})
	}
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// save returns iptables-save and ip6tables-save of ns without comments and
// counters.
func save(t *testing.T, ns *netnstest.NS, mode Mode) string {
	t.Helper()
	var b strings.Builder
	for _, f := range []Family{IPv4, IPv6} {
		for _, line := range strings.Split(ns.Exec(t, mode.binary(f)+"-save"), "\n") {
			if !strings.HasPrefix(line, "#") {
				b.WriteString(counters.ReplaceAllString(line, "[0:0]") + "\n")
			}
		}
	}
	return b.String()
}

func TestKernelApplyIsIdempotentAndRemoveCleansUp(t *testing.T) {
	roottest.Require(t)
	// A port no one else uses, to tell our rules apart in the root namespace.
	const marker = 47913
	for _, mode := range modes(t) {
		t.Run(mode.String(), func(t *testing.T) {
			pod, _ := topology(t)
			a := NewKernelApplier(KernelConfig{Netns: pod.Handle, Mode: mode})
			rs := mustInPod(t, PodSettings{
				IPv6: true, DNSCapture: true, RerouteVirtualInterfaces: []string{"tap0"},
				ExcludeOutboundPorts: []uint16{marker}, ExcludeInboundPorts: []uint16{8081},
				ExcludeOutboundIPRanges: prefixes("10.96.0.0/12", "fd00::/8"),
			})
			if d, err := a.Check(rs); err != nil || d.Empty() {
				t.Fatalf("Check before Apply: err %v, empty %v", err, d.Empty())
			}
			if err := a.Apply(rs); err != nil {
				t.Fatal(err)
			}
			// Check compares text, so an empty diff also proves our rules are
			// in the canonical form this variant prints.
			if d, err := a.Check(rs); err != nil || !d.Empty() {
				t.Fatalf("Check after Apply: err %v, diff:\n%s", err, d)
			}
			first := save(t, pod, mode)
			if !strings.Contains(first, fmt.Sprint(marker)) {
				t.Fatalf("rules not in the pod namespace:\n%s", first)
			}
			if err := a.Apply(rs); err != nil {
				t.Fatal(err)
			}
			if second := save(t, pod, mode); second != first {
				t.Fatalf("second Apply changed the rules:\n--- first\n%s--- second\n%s", first, second)
			}
			for _, m := range []Mode{ModeLegacy, ModeNFT} {
				for _, f := range []Family{IPv4, IPv6} {
					out, _ := exec.Command(m.binary(f) + "-save").Output()
					if strings.Contains(string(out), fmt.Sprint(marker)) {
						t.Fatalf("our rules leaked into the root namespace (%s)", m.binary(f))
					}
				}
			}
			for _, cmd := range [][]string{{"-4", "rule"}, {"-6", "rule"}} {
				if out := netnstest.Run(t, "ip", append([]string{"-n", pod.Name}, cmd...)...); !strings.Contains(out, "fwmark 0x111/0xfff lookup 100") {
					t.Errorf("ip %v: no fwmark rule:\n%s", cmd, out)
				}
			}
			for _, fam := range []string{"-4", "-6"} {
				if out := netnstest.Run(t, "ip", "-n", pod.Name, fam, "route", "show", "table", "100"); !strings.Contains(out, "local default dev lo") {
					t.Errorf("ip %s route table 100: %q", fam, out)
				}
			}

			// Drift: someone deletes our outbound redirect and adds a rule.
			pod.Exec(t, mode.binary(IPv4), "-t", "nat", "-D", ChainOutput, "!", "-d", "127.0.0.1/32", "-p", "tcp",
				"-m", "mark", "!", "--mark", "0x539/0xfff", "-j", "REDIRECT", "--to-ports", "15001")
			pod.Exec(t, mode.binary(IPv4), "-t", "nat", "-A", ChainOutput, "-p", "tcp", "--dport", "2222", "-j", "ACCEPT")
			pod.Exec(t, mode.binary(IPv4), "-t", "raw", "-D", "OUTPUT", "-j", ChainOutput)
			d, err := a.Check(rs)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{
				"+ ipv4 -t nat -A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
				"- ipv4 -t nat -A ISTIO_OUTPUT -p tcp -m tcp --dport 2222 -j ACCEPT",
				"+ ipv4 -t raw -A OUTPUT -j ISTIO_OUTPUT",
			} {
				if !strings.Contains(d.String(), want+"\n") {
					t.Errorf("diff lacks %q:\n%s", want, d)
				}
			}
			if err := a.Apply(rs); err != nil {
				t.Fatal(err)
			}
			if got := save(t, pod, mode); got != first {
				t.Fatalf("Apply did not repair the drift:\n--- want\n%s--- got\n%s", first, got)
			}

			if err := a.Remove(rs); err != nil {
				t.Fatal(err)
			}
			if got := save(t, pod, mode); strings.Contains(got, "ISTIO") || strings.Contains(got, "-A ") {
				t.Fatalf("rules left after Remove:\n%s", got)
			}
			for _, fam := range []string{"-4", "-6"} {
				if out := netnstest.Run(t, "ip", "-n", pod.Name, fam, "rule"); strings.Contains(out, "lookup 100") {
					t.Errorf("ip %s rule left after Remove:\n%s", fam, out)
				}
				if out := netnstest.Run(t, "ip", "-n", pod.Name, fam, "route", "show", "table", "100"); out != "" {
					t.Errorf("ip %s route table 100 left after Remove: %q", fam, out)
				}
			}
			if err := a.Remove(rs); err != nil {
				t.Fatalf("second Remove: %v", err)
			}
		})
	}
}

func TestKernelHostProbeRules(t *testing.T) {
	roottest.Require(t)
	for _, mode := range modes(t) {
		t.Run(mode.String(), func(t *testing.T) {
			host := netnstest.New(t, "host") // stands in for the node's namespace
			host.Exec(t, "ipset", "create", ProbeIPSetV4, "hash:ip", "family", "inet")
			host.Exec(t, "ipset", "create", ProbeIPSetV6, "hash:ip", "family", "inet6")
			host.Exec(t, mode.binary(IPv4), "-t", "nat", "-A", "POSTROUTING", "-j", "MASQUERADE")
			a := NewKernelApplier(KernelConfig{Netns: host.Handle, Mode: mode})
			rs := HostProbe(true)
			if err := a.Apply(rs); err != nil {
				t.Fatal(err)
			}
			if d, err := a.Check(rs); err != nil || !d.Empty() {
				t.Fatalf("Check: err %v, diff:\n%s", err, d)
			}
			out := host.Exec(t, mode.binary(IPv4), "-t", "nat", "-S", "POSTROUTING")
			if want := "-P POSTROUTING ACCEPT\n-A POSTROUTING -j ISTIO_POSTRT\n-A POSTROUTING -j MASQUERADE\n"; out != want {
				t.Fatalf("POSTROUTING:\n%s\nwant our jump first:\n%s", out, want)
			}
			if err := a.Remove(rs); err != nil {
				t.Fatal(err)
			}
			if got := save(t, host, mode); strings.Contains(got, "ISTIO") || !strings.Contains(got, "MASQUERADE") {
				t.Fatalf("after Remove:\n%s", got)
			}
		})
	}
}

func TestDetectMode(t *testing.T) {
	roottest.Require(t)
	modes(t)
	for _, tc := range []struct {
		name  string
		setup []string
		want  Mode
	}{
		{"empty", nil, ModeDefault},
		{"legacy", []string{"iptables-legacy", "-t", "nat", "-A", "OUTPUT", "-j", "ACCEPT"}, ModeLegacy},
		{"nft", []string{"iptables-nft", "-t", "nat", "-A", "OUTPUT", "-j", "ACCEPT"}, ModeNFT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netnstest.New(t, "host")
			if tc.setup != nil {
				ns.Exec(t, tc.setup[0], tc.setup[1:]...)
			}
			var got Mode
			ns.Do(func() error { got = DetectMode(); return nil })
			if got != tc.want {
				t.Fatalf("DetectMode = %v, want %v", got, tc.want)
			}
		})
	}
}
