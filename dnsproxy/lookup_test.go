package dnsproxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// HostResolver asks A and AAAA, caches the answer for its TTL, asks again
// after it, and does not cache NXDOMAIN.
func TestHostResolverCachesByTTL(t *testing.T) {
	u := startUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case q.Name != "ext.test.":
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			m.Answer = []dns.RR{
				&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.IPv4(192, 0, 2, 1)},
				&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 10}, A: net.IPv4(192, 0, 2, 2)},
			}
		case q.Qtype == dns.TypeAAAA:
			m.Answer = []dns.RR{&dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 60},
				AAAA: net.ParseIP("2001:db8::1")}}
		}
		w.WriteMsg(m)
	})
	fwd, err := NewForwarder(ForwarderConfig{Servers: []netip.AddrPort{u.addr}, NoMark: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewHostResolver(fwd, true)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	want := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::1")}
	ctx := context.Background()
	for i := range 3 {
		got, err := r.LookupHost(ctx, nil, "EXT.test")
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("lookup %d: %v (%v), want %v", i, got, err, want)
		}
	}
	if n := u.udpCount.Load(); n != 2 {
		t.Fatalf("%d upstream queries for three lookups in the TTL, want 2 (A, AAAA once)", n)
	}
	now = now.Add(11 * time.Second) // past the smallest TTL
	if _, err := r.LookupHost(ctx, nil, "ext.test"); err != nil {
		t.Fatal(err)
	}
	if n := u.udpCount.Load(); n != 4 {
		t.Fatalf("%d upstream queries after the TTL, want 4", n)
	}
	for range 2 {
		if _, err := r.LookupHost(ctx, nil, "nx.test"); !errors.Is(err, ErrNoAddress) {
			t.Fatalf("nx.test: %v, want ErrNoAddress", err)
		}
	}
	if n := u.udpCount.Load(); n != 8 {
		t.Fatalf("%d upstream queries after two NXDOMAIN lookups, want 8 (not cached)", n)
	}
}
