package agent

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
)

func TestScanNetns(t *testing.T) {
	roottest.Require(t)
	a := netnstest.New(t, "a")
	b := netnstest.New(t, "b")
	netnstest.Veth(t, a, "va", []string{"10.77.0.1/24"}, b, "vb", []string{"10.77.0.2/24"})
	self, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	for _, tc := range []struct {
		name  string
		ips   []string
		hint  string
		self  netns.ID
		want  netns.ID
		errIs error
	}{
		{name: "by IP", ips: []string{"10.77.0.2"}, want: b.ID()},
		{name: "any of the IPs", ips: []string{"10.99.9.9", "10.77.0.1"}, want: a.ID()},
		{name: "hint checked like the rest", ips: []string{"10.77.0.2"}, hint: "/var/run/netns/" + a.Name, want: b.ID()},
		{name: "the agent's own netns is never a pod's", ips: []string{"10.77.0.2"}, self: b.ID(), errIs: ErrNetnsNotFound},
		{name: "unknown IP", ips: []string{"10.99.9.9"}, errIs: ErrNetnsNotFound},
		{name: "no IPs", errIs: ErrNetnsNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ips []netip.Addr
			for _, s := range tc.ips {
				ips = append(ips, netip.MustParseAddr(s))
			}
			selfID := self.ID()
			if tc.self != (netns.ID{}) {
				selfID = tc.self
			}
			path, h, err := ScanNetns(context.Background(), ips, tc.hint, selfID)
			if tc.errIs != nil {
				if !errors.Is(err, tc.errIs) {
					t.Fatalf("ScanNetns = %q, %v; want %v", path, err, tc.errIs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if h.ID() != tc.want {
				t.Fatalf("ScanNetns found %s (%s), want %s", path, h.ID(), tc.want)
			}
		})
	}
}
