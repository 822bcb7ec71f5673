package dnsproxy

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzServeDNS feeds arbitrary bytes to the request path (validation, local
// answers, forwarding to a real upstream on 127.0.0.1) over both transports.
// It must not panic, must drop only packets that cannot be answered
// (shorter than a header, or responses), and every reply must parse, be a
// response to the query's ID, echo its question and fit the client's size.
func FuzzServeDNS(f *testing.F) {
	seed := func(m *dns.Msg) {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
		f.Add(b, true)
	}
	for _, name := range []string{"echo.", "api.example.com.client-ns.svc.cluster.local.", "foo.wild.example.com.",
		"alias.", "headless.", "www.example.org.", "nx.test.", "many.client-ns.svc.cluster.local."} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT} {
			seed(newQuery(name, qt))
		}
	}
	big := newQuery("big.test.", dns.TypeTXT)
	big.SetEdns0(1232, false)
	seed(big)
	f.Add([]byte{}, false)
	f.Add([]byte{0, 1, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, false)          // compression loop
	f.Add([]byte{0, 1, 0x81, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}, true)                  // a response
	f.Add([]byte{0, 1, 0x10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0, 0, 1, 0, 3}, false)         // opcode 2, class CHAOS
	f.Add([]byte{0, 1, 0x01, 0, 0, 2, 0, 0, 0, 0, 0, 1, 1, 'a', 0, 0, 1, 0, 1}, false)         // lying counts
	f.Add([]byte{0, 1, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 41, 0, 0}, false) // cut OPT

	// A short upstream timeout keeps queries the upstream ignores cheap.
	up := startUpstream(f, upstreamAnswer)
	fwd, err := NewForwarder(ForwarderConfig{Servers: []netip.AddrPort{up.addr}, NoMark: true, Timeout: 200 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	ts := startServer(f, Config{}, fwd)
	apply(f, ts.store, manyEndpoints(clientNS, "many", 60)...)
	src := netip.MustParseAddrPort("127.0.0.1:5353")

	f.Fuzz(func(t *testing.T, raw []byte, tcp bool) {
		proto := protoUDP
		if tcp {
			proto = protoTCP
		}
		var q query
		q.reset(proto, src)
		var replies [][]byte
		reply, fwd := ts.Server.decide(raw, &q, nil)
		if reply != nil {
			replies = append(replies, append([]byte(nil), reply...))
		}
		if fwd {
			if reply != nil {
				t.Fatal("both a reply and a forward")
			}
			ts.Server.forward(q.clone(raw), func(b []byte) { replies = append(replies, append([]byte(nil), b...)) })
		}
		if len(replies) == 0 {
			if len(raw) >= 12 && raw[2]&0x80 == 0 {
				t.Fatalf("query dropped without a reply: % x", raw)
			}
			return
		}
		if len(replies) != 1 {
			t.Fatalf("%d replies", len(replies))
		}
		r := new(dns.Msg)
		if err := r.Unpack(replies[0]); err != nil {
			t.Fatalf("reply does not parse: %v\nquery % x\nreply % x", err, raw, replies[0])
		}
		if !r.Response || r.Id != binary.BigEndian.Uint16(raw) {
			t.Fatalf("reply header %v for query ID %d", r.MsgHdr, binary.BigEndian.Uint16(raw))
		}
		if proto == protoUDP && len(replies[0]) > q.size {
			t.Fatalf("UDP reply of %d bytes for a client size of %d", len(replies[0]), q.size)
		}
		if len(r.Question) > 0 && len(q.msg.Question) == 1 &&
			(!strings.EqualFold(r.Question[0].Name, q.msg.Question[0].Name) || r.Question[0].Qtype != q.msg.Question[0].Qtype) {
			t.Fatalf("reply question %v for query question %v", r.Question[0], q.msg.Question[0])
		}
	})
}
