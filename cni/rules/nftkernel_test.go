package rules

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
)

// nftDump lists every nftables table of ns without counters.
func nftDump(t *testing.T, ns *netnstest.NS) string {
	t.Helper()
	return nftCounter.ReplaceAllString(ns.Exec(t, "nft", "list", "ruleset"), "counter")
}

func TestKernelNFTApplyIsIdempotentAndRemoveCleansUp(t *testing.T) {
	roottest.Require(t)
	requireNFT(t)
	const marker = 47914 // a port no one else uses
	pod, _ := topology(t)
	a := NewNFTApplier(NFTConfig{Netns: pod.Handle})
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
	// Check compares text, so an empty diff proves the translation is in
	// the canonical form nft lists.
	if d, err := a.Check(rs); err != nil || !d.Empty() {
		t.Fatalf("Check after Apply: err %v, diff:\n%s", err, d)
	}
	first := nftDump(t, pod)
	for _, want := range []string{"table inet istio-ambient-nat", "table inet istio-ambient-mangle", "table inet istio-ambient-raw", fmt.Sprint(marker)} {
		if !strings.Contains(first, want) {
			t.Fatalf("ruleset lacks %q:\n%s", want, first)
		}
	}
	if out, _ := exec.Command("nft", "list", "ruleset").Output(); strings.Contains(string(out), fmt.Sprint(marker)) {
		t.Fatal("our tables leaked into the root namespace")
	}
	if err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if second := nftDump(t, pod); second != first {
		t.Fatalf("second Apply changed the ruleset:\n--- first\n%s--- second\n%s", first, second)
	}
	for _, fam := range []string{"-4", "-6"} {
		if out := netnstest.Run(t, "ip", "-n", pod.Name, fam, "rule"); !strings.Contains(out, "fwmark 0x111/0xfff lookup 100") {
			t.Errorf("ip %s rule: no fwmark rule:\n%s", fam, out)
		}
	}

	// Drift: a rule deleted, one added, a base chain's jump gone, and a
	// foreign table that must survive.
	pod.Exec(t, "nft", "flush", "chain", "inet", "istio-ambient-raw", "output")
	pod.Exec(t, "nft", "add", "rule", "inet", "istio-ambient-nat", "istio-output", "tcp", "dport", "2222", "accept")
	pod.Exec(t, "nft", "add", "table", "inet", "someone-else")
	d, err := a.Check(rs)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"- nft inet istio-ambient-nat istio-output tcp dport 2222 accept",
		"+ nft inet istio-ambient-raw output jump istio-output",
	} {
		if !strings.Contains(d.String(), want+"\n") {
			t.Errorf("diff lacks %q:\n%s", want, d)
		}
	}
	if err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	if got := strings.Replace(nftDump(t, pod), "table inet someone-else {\n}\n", "", 1); got != first {
		t.Fatalf("Apply did not repair the drift:\n--- want\n%s--- got\n%s", first, got)
	}

	// Turning DNS capture off deletes the raw table in the same way.
	noDNS := mustInPod(t, PodSettings{IPv6: true})
	if err := a.Apply(noDNS); err != nil {
		t.Fatal(err)
	}
	if got := nftDump(t, pod); strings.Contains(got, "istio-ambient-raw") || !strings.Contains(got, "istio-ambient-nat") {
		t.Fatalf("after DNS capture off:\n%s", got)
	}

	if err := a.Remove(rs); err != nil {
		t.Fatal(err)
	}
	if got := nftDump(t, pod); got != "table inet someone-else {\n}\n" {
		t.Fatalf("after Remove, want only the foreign table:\n%s", got)
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
}

// An nftables applier taking over a pod an iptables agent captured installs
// its tables, then deletes the iptables chains; a client dialing all along
// is captured every time, with no window between the two. The way back (an
// iptables applier with MigrateFromNFT) is held to the same standard.
func TestKernelNFTMigratesFromIPTables(t *testing.T) {
	roottest.Require(t)
	requireNFT(t)
	rs := mustInPod(t, PodSettings{IPv6: true, DNSCapture: true})
	for _, mode := range modes(t) {
		t.Run(mode.String(), func(t *testing.T) {
			pod, peer := topology(t)
			ipt := NewKernelApplier(KernelConfig{Netns: pod.Handle, Mode: mode})
			nft := NewNFTApplier(NFTConfig{Netns: pod.Handle, MigrateFrom: []Mode{mode}})
			migrate(t, pod, peer, rs, ipt, nft, "x "+IPv4.String()+" -t nat "+ChainOutput)
			if got := save(t, pod, mode); strings.Contains(got, "ISTIO") {
				t.Fatalf("iptables chains left after the migration:\n%s", got)
			}
			if !strings.Contains(nftDump(t, pod), NFTTableName("nat")) {
				t.Fatalf("no nftables tables after the migration")
			}
		})
		t.Run(mode.String()+"-back", func(t *testing.T) {
			pod, peer := topology(t)
			nft := NewNFTApplier(NFTConfig{Netns: pod.Handle})
			ipt := NewKernelApplier(KernelConfig{Netns: pod.Handle, Mode: mode, MigrateFromNFT: true})
			migrate(t, pod, peer, rs, nft, ipt, "x nft inet "+NFTTableName("nat"))
			if got := nftDump(t, pod); strings.Contains(got, NFTTablePrefix) {
				t.Fatalf("nftables tables left after the migration back:\n%s", got)
			}
			if !strings.Contains(save(t, pod, mode), ChainOutput) {
				t.Fatalf("no iptables chains after the migration back")
			}
			if err := ipt.Remove(rs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// migrate captures pod with from, then applies to while a client in pod
// and one in peer dial continuously; every connection must reach the
// stand-in proxy listeners. to.Check must first report wantStale.
func migrate(t *testing.T, pod, peer *netnstest.NS, rs RuleSet, from, to Applier, wantStale string) {
	t.Helper()
	serveTCP(t, pod, "127.0.0.1:15001", "outbound")
	serveTCP(t, pod, "0.0.0.0:15006", "inbound")
	serveTCP(t, peer, "0.0.0.0:8080", "peer")
	if err := from.Apply(rs); err != nil {
		t.Fatal(err)
	}
	d, err := to.Check(rs)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.String(), wantStale+"\n") {
		t.Errorf("Check does not report %q:\n%s", wantStale, d)
	}

	var stop atomic.Bool
	var n, bypassed atomic.Int64
	var firstBypass atomic.Value
	var wg sync.WaitGroup
	for _, p := range []struct {
		from      *netnstest.NS
		addr, rep string
	}{{pod, "10.77.0.2:8080", "outbound 10.77.0.2:8080"}, {peer, "10.77.0.1:8080", "inbound 10.77.0.1:8080"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				n.Add(1)
				if got := exchange(p.from, "tcp", p.addr, 0); got != p.rep {
					bypassed.Add(1)
					firstBypass.CompareAndSwap(nil, fmt.Sprintf("%s: %q", p.addr, got))
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	for range 3 { // the first Apply migrates; the others find nothing to do
		if err := to.Apply(rs); err != nil {
			t.Error(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if b := bypassed.Load(); b > 0 {
		t.Errorf("%d of %d connections were not captured during the migration; first: %v", b, n.Load(), firstBypass.Load())
	} else {
		t.Logf("%d connections during the migration, all captured", n.Load())
	}
	if d, err := to.Check(rs); err != nil || !d.Empty() {
		t.Fatalf("Check after the migration: err %v, diff:\n%s", err, d)
	}
	if got := exchange(pod, "tcp", "10.77.0.2:8080", 0); got != "outbound 10.77.0.2:8080" {
		t.Fatalf("after the migration: %q", got)
	}
	if out := netnstest.Run(t, "ip", "-n", pod.Name, "-4", "rule"); !strings.Contains(out, "lookup 100") {
		t.Fatalf("the migration removed the policy route:\n%s", out)
	}
}

// NFTHost SNATs node-local TCP to captured pod IPs to the probe address,
// keeps set members across a repeated Setup, and cleans up.
func TestKernelNFTHostProbe(t *testing.T) {
	roottest.Require(t)
	requireNFT(t)
	host := netnstest.New(t, "host")
	pod := netnstest.New(t, "pod")
	netnstest.Veth(t, host, "eth0", []string{"10.78.0.1/24"}, pod, "eth0", []string{"10.78.0.2/24"})
	netnstest.IP(t, "-n", pod.Name, "route", "add", "default", "via", "10.78.0.1")
	ln, err := pod.Listen(context.Background(), netip.MustParseAddrPort("10.78.0.2:8080"), netns.SockOpts{})
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
			io.WriteString(c, c.RemoteAddr().(*net.TCPAddr).IP.String())
			c.Close()
		}
	}()
	source := func() string { return exchange(host, "tcp", "10.78.0.2:8080", 0) } // what the pod sees
	h := NewNFTHost(true)
	do := func(fn func() error) {
		t.Helper()
		if err := host.Do(fn); err != nil {
			t.Fatal(err)
		}
	}
	do(h.Setup)
	if got := source(); got != "10.78.0.1" {
		t.Fatalf("before the pod is in the set, the pod sees %q", got)
	}
	pip := []netip.Addr{netip.MustParseAddr("10.78.0.2"), netip.MustParseAddr("fd78::2")}
	do(func() error { return h.AddPodIPs(pip) })
	do(func() error { return h.AddPodIPs(pip) }) // idempotent
	do(h.Setup)                                  // a restarted agent keeps the members
	if got := source(); got != ProbeSNATv4 {
		t.Fatalf("probe from the node: the pod sees %q, want %s", got, ProbeSNATv4)
	}
	if got := nftDump(t, host); !strings.Contains(got, "elements = { fd78::2 }") {
		t.Errorf("v6 set:\n%s", got)
	}
	do(func() error { return h.DelPodIPs(pip) })
	do(func() error { return h.DelPodIPs(pip) }) // absent: no error
	if got := source(); got != "10.78.0.1" {
		t.Fatalf("after DelPodIPs the pod sees %q", got)
	}
	do(h.Teardown)
	do(h.Teardown)
	if got := nftDump(t, host); strings.Contains(got, NFTTablePrefix) {
		t.Fatalf("after Teardown:\n%s", got)
	}
}
