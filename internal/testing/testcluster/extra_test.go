package testcluster

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// TestExtraNetNS: namespaces from AddNetNS carry the cluster's prefix, are
// wired with IP and Sysctl, CaptureBridge sees what crosses a bridge in
// one of them, and the cluster's cleanup deletes them.
func TestExtraNetNS(t *testing.T) {
	var names []string
	t.Run("cluster", func(t *testing.T) {
		c := New(t, Options{})
		router, err := c.AddNetNS("router")
		if err != nil {
			t.Fatal(err)
		}
		host, err := c.AddNetNS("host")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.AddNetNS("bad/name"); err == nil {
			t.Fatal("AddNetNS accepted a suffix with a slash")
		}
		names = []string{router.NetNSName(), host.NetNSName()}
		for _, n := range names {
			if want := nsPrefix(c.ID()); len(n) <= len(want) || n[:len(want)] != want {
				t.Fatalf("namespace %q lacks the cluster prefix %q", n, want)
			}
		}
		if err := router.IP("link add xb0 type bridge", "addr add 10.99.0.1/24 dev xb0", "link set xb0 up",
			"link add p0 type veth peer name eth0 netns "+host.NetNSName(), "link set p0 master xb0 up"); err != nil {
			t.Fatal(err)
		}
		if err := host.IP("addr add 10.99.0.2/24 dev eth0", "link set eth0 up"); err != nil {
			t.Fatal(err)
		}
		if err := router.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			t.Fatal(err)
		}
		ln, err := host.Listen("10.99.0.2:7000")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if conn, err := ln.Accept(); err == nil {
				conn.Close()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		capture, err := router.CaptureBridge(ctx, "xb0", "tcp port 7000")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := router.Dial(ctx, "tcp", "10.99.0.2:7000")
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		pkts, err := capture.Stop()
		if err != nil {
			t.Fatal(err)
		}
		syn := false
		for _, p := range pkts {
			if p.Proto == "tcp" && p.TCPFlags&TCPSyn != 0 && p.Dst == netip.MustParseAddrPort("10.99.0.2:7000") {
				syn = true
			}
		}
		if !syn {
			t.Fatalf("no SYN to 10.99.0.2:7000 among %d captured packets", len(pkts))
		}
	})
	for _, n := range names {
		if left, err := listNetNS(n); err != nil || len(left) > 0 {
			t.Errorf("after cleanup: %v %v", left, err)
		}
	}
}
