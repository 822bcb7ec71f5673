package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

// upstream is a test resolver on 127.0.0.1 (UDP and TCP, one port).
type upstream struct {
	addr     netip.AddrPort
	udpCount atomic.Int64
	tcpCount atomic.Int64
}

// startUpstream serves handler on 127.0.0.1 over UDP and TCP. It accepts
// every message, so odd queries reach handler.
func startUpstream(t testing.TB, handler func(w dns.ResponseWriter, r *dns.Msg)) *upstream {
	t.Helper()
	var pc net.PacketConn
	var ln net.Listener
	for attempt := 0; ln == nil; attempt++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		// The UDP port may be taken for TCP (by a client socket): retry.
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			pc.Close()
			if attempt == 10 {
				t.Fatal(err)
			}
		}
	}
	u := &upstream{addr: pc.LocalAddr().(*net.UDPAddr).AddrPort()}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		if w.LocalAddr().Network() == "tcp" {
			u.tcpCount.Add(1)
		} else {
			u.udpCount.Add(1)
		}
		handler(w, r)
	})
	accept := func(dns.Header) dns.MsgAcceptAction { return dns.MsgAccept }
	for _, srv := range []*dns.Server{
		{PacketConn: pc, Handler: h, MsgAcceptFunc: accept},
		{Listener: ln, Handler: h, MsgAcceptFunc: accept},
	} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		t.Cleanup(func() { srv.Shutdown() })
	}
	return u
}

// upstreamAnswer answers every A query with 192.0.2.<n> for n in 1..count,
// TXT queries for big.test with 100 records, and NXDOMAIN for nx.test;
// over UDP it truncates to the query's EDNS size as a real server does.
func upstreamAnswer(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	switch {
	case q.Name == "nx.test.":
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeTXT && q.Name == "big.test.":
		for i := 0; i < 100; i++ {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60},
				Txt: []string{fmt.Sprintf("record number %03d with some padding to make it long", i)}})
		}
	case q.Qtype == dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A: net.IPv4(192, 0, 2, 1)})
	}
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), false)
	}
	if w.LocalAddr().Network() == "udp" {
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

type testServer struct {
	*Server
	addr    netip.AddrPort
	reg     *prometheus.Registry
	logs    *observer.ObservedLogs
	store   *state.Store
	upAddr  netip.AddrPort
	upstram *upstream
}

// startServer runs a Server on 127.0.0.1:0 for the mesh state, attributed to
// client-ns/client (queries come from 127.0.0.1, so the WorkloadInfo
// fallback finds the client), forwarding to an upstream answering with
// upstreamAnswer unless fwd is given.
func startServer(t testing.TB, cfg Config, fwd *Forwarder) *testServer {
	t.Helper()
	ts := &testServer{reg: prometheus.NewRegistry(), store: meshState(t)}
	if fwd == nil {
		ts.upstram = startUpstream(t, upstreamAnswer)
		var err error
		fwd, err = NewForwarder(ForwarderConfig{Servers: []netip.AddrPort{ts.upstram.addr}, NoMark: true})
		if err != nil {
			t.Fatal(err)
		}
	}
	core, logs := observer.New(zapcore.DebugLevel)
	ts.logs = logs
	if cfg.Workload == (WorkloadInfo{}) {
		cfg.Workload = WorkloadInfo{Namespace: clientNS, Name: "client"}
	}
	if cfg.ListenAddrs == nil {
		cfg.ListenAddrs = []netip.AddrPort{loopback}
	}
	s, err := New(cfg, Deps{Store: ts.store, Forwarder: fwd, Metrics: NewMetrics(ts.reg), Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	ts.Server = s
	ts.addr = s.Addrs()[0]
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ts
}

func exchange(t testing.TB, proto string, addr netip.AddrPort, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: proto, Timeout: 10 * time.Second, UDPSize: 65535}
	if opt := m.IsEdns0(); opt == nil && proto == "udp" {
		c.UDPSize = dns.MinMsgSize
	}
	r, _, err := c.Exchange(m, addr.String())
	if err != nil {
		t.Fatalf("exchange %s %s: %v", proto, m.Question[0].Name, err)
	}
	return r
}

func newQuery(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func TestServeLocalAnswers(t *testing.T) {
	ts := startServer(t, Config{}, nil)
	for _, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			r := exchange(t, proto, ts.addr, newQuery("api.example.com.client-ns.svc.cluster.local.", dns.TypeA))
			if r.Rcode != dns.RcodeSuccess || !r.Authoritative || !r.RecursionAvailable {
				t.Fatalf("reply header: %v", r.MsgHdr)
			}
			if len(r.Answer) != 2 {
				t.Fatalf("answers: %v", r.Answer)
			}
			cn, ok := r.Answer[0].(*dns.CNAME)
			if !ok || cn.Target != "api.example.com." || cn.Hdr.Ttl != TTL {
				t.Errorf("first answer %v, want CNAME to api.example.com. with TTL 30", r.Answer[0])
			}
			a, ok := r.Answer[1].(*dns.A)
			if !ok || a.Hdr.Name != "api.example.com." || !a.A.Equal(net.ParseIP("240.240.0.1")) || a.Hdr.Ttl != TTL {
				t.Errorf("second answer %v, want api.example.com. A 240.240.0.1 TTL 30", r.Answer[1])
			}
			// A mesh name without records of the family: NOERROR, no answer.
			r = exchange(t, proto, ts.addr, newQuery("db.other.svc.cluster.local.", dns.TypeAAAA))
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 || !r.Authoritative {
				t.Errorf("AAAA of IPv4-only service: rcode %s, %d answers, aa=%v; want authoritative NOERROR without answers",
					dns.RcodeToString[r.Rcode], len(r.Answer), r.Authoritative)
			}
		})
	}
	if got := testutil.ToFloat64(ts.Server.metrics.requests.WithLabelValues("a", "udp", "client-app", "v1")); got != 1 {
		t.Errorf("istio_dns_requests_total{a,udp,client-app,v1} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(ts.Server.metrics.requests.WithLabelValues("aaaa", "tcp", "client-app", "v1")); got != 1 {
		t.Errorf("istio_dns_requests_total{aaaa,tcp,client-app,v1} = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(ts.reg, "istio_dns_upstream_requests_total"); n != 0 {
		t.Errorf("%d upstream series for local answers, want 0", n)
	}
	entries := ts.logs.FilterMessage("dns query").FilterField(zap.String("result", outcomeNoRecords)).All()
	if len(entries) != 2 {
		t.Errorf("%d 'no records' log lines, want 2", len(entries))
	}
	if n := ts.logs.FilterMessage("dns query").FilterField(zap.String("result", outcomeAnswered)).
		FilterField(zap.String("src.workload", "client")).Len(); n != 2 {
		t.Errorf("%d 'answered' log lines for src.workload=client, want 2", n)
	}
}

func TestServeShuffles(t *testing.T) {
	ts := startServer(t, Config{}, nil)
	// 20 endpoints: 30 answers in one order would be a 1 in 20!^29 chance.
	apply(t, ts.store, manyEndpoints(clientNS, "many", 20)...)
	orders := map[string]bool{}
	for i := 0; i < 30; i++ {
		r := exchange(t, "tcp", ts.addr, newQuery("many.client-ns.svc.cluster.local.", dns.TypeA))
		if len(r.Answer) != 20 {
			t.Fatalf("%d answers, want 20", len(r.Answer))
		}
		orders[fmt.Sprint(r.Answer)] = true
	}
	if len(orders) < 2 {
		t.Errorf("30 answers came in %d order(s); want them shuffled", len(orders))
	}
}

func TestServeForwards(t *testing.T) {
	ts := startServer(t, Config{}, nil)
	for _, proto := range []string{"udp", "tcp"} {
		m := newQuery("www.example.org.", dns.TypeA)
		m.Id = 4242
		r := exchange(t, proto, ts.addr, m)
		if r.Id != 4242 || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Authoritative {
			t.Fatalf("%s: forwarded reply %v", proto, r)
		}
		if a := r.Answer[0].(*dns.A); !a.A.Equal(net.ParseIP("192.0.2.1")) {
			t.Errorf("%s: answer %v, want the upstream's 192.0.2.1", proto, a)
		}
		r = exchange(t, proto, ts.addr, newQuery("nx.test.", dns.TypeA))
		if r.Rcode != dns.RcodeNameError {
			t.Errorf("%s: nx.test rcode %s, want the upstream's NXDOMAIN", proto, dns.RcodeToString[r.Rcode])
		}
		// Other types are forwarded even for mesh names.
		r = exchange(t, proto, ts.addr, newQuery("echo.client-ns.svc.cluster.local.", dns.TypeMX))
		if r.Authoritative || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: MX for a mesh name: %v, want the upstream's answer", proto, r.MsgHdr)
		}
	}
	// All forwards go to the upstream over UDP (no truncation involved).
	if got := ts.upstram.udpCount.Load(); got != 6 {
		t.Errorf("upstream saw %d UDP queries, want 6", got)
	}
	if got := testutil.ToFloat64(ts.Server.metrics.upstreamRequests.WithLabelValues("a", "udp", "client-app", "v1")); got != 2 {
		t.Errorf("istio_dns_upstream_requests_total{a,udp} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(ts.Server.metrics.upstreamRequests.WithLabelValues("mx", "tcp", "client-app", "v1")); got != 1 {
		t.Errorf("istio_dns_upstream_requests_total{mx,tcp} = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(ts.reg, "istio_dns_upstream_request_duration_seconds"); n != 4 {
		t.Errorf("%d duration series, want 4 (a/mx × udp/tcp)", n)
	}
	if n := testutil.CollectAndCount(ts.reg, "istio_dns_upstream_failures_total"); n != 0 {
		t.Errorf("%d failure series, want 0", n)
	}
	if n := ts.logs.FilterMessage("dns query").FilterField(zap.String("result", outcomeForwarded)).Len(); n != 6 {
		t.Errorf("%d 'forwarded' log lines, want 6", n)
	}
}

func TestServeUpstreamFailure(t *testing.T) {
	// A UDP port with nothing behind it: the upstream answers with ICMP
	// port unreachable, so the failure is immediate.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	fwd, err := NewForwarder(ForwarderConfig{Servers: []netip.AddrPort{dead}, NoMark: true, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{}, fwd)
	r := exchange(t, "udp", ts.addr, newQuery("www.example.org.", dns.TypeA))
	if r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if got := testutil.ToFloat64(ts.Server.metrics.upstreamFailures.WithLabelValues("a", "udp", "client-app", "v1")); got != 1 {
		t.Errorf("istio_dns_upstream_failures_total = %v, want 1", got)
	}
	if n := ts.logs.FilterMessage("dns query").FilterField(zap.String("result", outcomeFailed)).Len(); n != 1 {
		t.Errorf("%d 'failed' log lines, want 1", n)
	}
}

func TestServeUnknownClient(t *testing.T) {
	ts := startServer(t, Config{Workload: WorkloadInfo{Namespace: "nowhere", Name: "nobody"}}, nil)
	for _, name := range []string{"echo.client-ns.svc.cluster.local.", "www.example.org."} {
		r := exchange(t, "udp", ts.addr, newQuery(name, dns.TypeA))
		if r.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s from an unknown workload: rcode %s, want SERVFAIL", name, dns.RcodeToString[r.Rcode])
		}
	}
	if got := ts.upstram.udpCount.Load(); got != 0 {
		t.Errorf("upstream saw %d queries from an unknown workload, want 0", got)
	}
	if got := testutil.ToFloat64(ts.Server.metrics.requests.WithLabelValues("a", "udp", "unknown", "unknown")); got != 2 {
		t.Errorf("istio_dns_requests_total{unknown} = %v, want 2", got)
	}
}

func TestServeClientBySourceIP(t *testing.T) {
	// The querying workload owns 127.0.0.1: it is found by the source IP,
	// so its namespace decides the short-name expansion, whatever the
	// server's own WorkloadInfo says.
	ts := startServer(t, Config{Workload: WorkloadInfo{Namespace: "nowhere", Name: "nobody"}}, nil)
	apply(t, ts.store, podAddr("other", "by-ip", []string{"127.0.0.1"}))
	r := exchange(t, "udp", ts.addr, newQuery("db.", dns.TypeA))
	if len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(net.ParseIP("10.96.0.20")) {
		t.Errorf("db. from a workload in namespace other: %v, want db.other's VIP", r.Answer)
	}
}

func TestServeTruncation(t *testing.T) {
	ts := startServer(t, Config{}, nil)
	apply(t, ts.store, manyEndpoints(clientNS, "many", 60)...)
	const local = "many.client-ns.svc.cluster.local."
	tests := []struct {
		name      string
		proto     string
		qname     string
		qtype     uint16
		edns      uint16 // 0: no OPT record
		wantTC    bool
		wantCount int // answers; -1: fewer than all, at least one
		maxSize   int
	}{
		{"local, UDP, no EDNS: 512 bytes", "udp", local, dns.TypeA, 0, true, -1, 512},
		{"local, UDP, EDNS 4096: all", "udp", local, dns.TypeA, 4096, false, 60, 4096},
		{"local, UDP, EDNS 600", "udp", local, dns.TypeA, 600, true, -1, 600},
		{"local, UDP, EDNS below 512 means 512", "udp", local, dns.TypeA, 100, true, -1, 512},
		{"local, TCP: all", "tcp", local, dns.TypeA, 0, false, 60, 65535},
		{"forwarded, UDP, no EDNS", "udp", "big.test.", dns.TypeTXT, 0, true, -1, 512},
		{"forwarded, UDP, EDNS 1232", "udp", "big.test.", dns.TypeTXT, 1232, true, -1, 1232},
		{"forwarded, UDP, EDNS 65000: all", "udp", "big.test.", dns.TypeTXT, 65000, false, 100, 65000},
		{"forwarded, TCP: all", "tcp", "big.test.", dns.TypeTXT, 0, false, 100, 65535},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newQuery(tc.qname, tc.qtype)
			if tc.edns != 0 {
				m.SetEdns0(tc.edns, false)
			}
			raw := rawExchange(t, tc.proto, ts.addr, mustPack(t, m))
			if len(raw) > tc.maxSize {
				t.Errorf("reply is %d bytes, more than %d", len(raw), tc.maxSize)
			}
			r := new(dns.Msg)
			if err := r.Unpack(raw); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if r.Truncated != tc.wantTC {
				t.Errorf("TC = %v, want %v", r.Truncated, tc.wantTC)
			}
			switch {
			case tc.wantCount >= 0 && len(r.Answer) != tc.wantCount:
				t.Errorf("%d answers, want %d", len(r.Answer), tc.wantCount)
			case tc.wantCount < 0 && (len(r.Answer) == 0 || len(r.Answer) >= 60):
				t.Errorf("%d answers, want a truncated non-empty set", len(r.Answer))
			}
			if (tc.edns != 0) != (r.IsEdns0() != nil) {
				t.Errorf("OPT in reply = %v, want %v", r.IsEdns0() != nil, tc.edns != 0)
			}
		})
	}
	// The upstream got big.test over UDP, saw it truncated and was asked
	// again over TCP (once per UDP case that it could not fit).
	if ts.upstram.tcpCount.Load() < 2 {
		t.Errorf("upstream saw %d TCP queries; want the forwarder to retry truncated answers over TCP", ts.upstram.tcpCount.Load())
	}
}

func TestServeBadInput(t *testing.T) {
	ts := startServer(t, Config{}, nil)
	good := mustPack(t, newQuery("www.example.org.", dns.TypeA))
	hdr := func(id uint16, flags uint16, qd, an, ns, ar uint16) []byte {
		b := make([]byte, 12)
		for i, v := range []uint16{id, flags, qd, an, ns, ar} {
			binary.BigEndian.PutUint16(b[2*i:], v)
		}
		return b
	}
	question := func(name []byte, qtype, class uint16) []byte {
		b := append([]byte(nil), name...)
		return binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(b, qtype), class)
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	www := []byte("\x03www\x07example\x03org\x00")
	withOPT := func(m *dns.Msg, version uint8, n int) []byte {
		for i := 0; i < n; i++ {
			o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
			o.SetUDPSize(1232)
			o.SetVersion(version)
			m.Extra = append(m.Extra, o)
		}
		return mustPack(t, m)
	}
	long := newQuery("www.example.org.", dns.TypeA)
	long.SetEdns0(4096, false)
	long.IsEdns0().Option = append(long.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: 65001, Data: make([]byte, 5000)})

	const drop = -1
	tests := []struct {
		name  string
		pkt   []byte
		rcode int // drop: no reply at all
	}{
		{"empty", []byte{}, drop},
		{"short header", []byte{1, 2, 3, 4, 5}, drop},
		{"a response", cat(hdr(7, 0x8000, 1, 0, 0, 0), question(www, 1, 1)), drop},
		{"question cut short", cat(hdr(7, 0x0100, 1, 0, 0, 0), []byte("\x03ww")), dns.RcodeFormatError},
		{"no question", hdr(7, 0x0100, 0, 0, 0, 0), dns.RcodeFormatError},
		{"two questions", cat(hdr(7, 0x0100, 2, 0, 0, 0), question(www, 1, 1), question(www, 28, 1)), dns.RcodeFormatError},
		{"label longer than 63", cat(hdr(7, 0x0100, 1, 0, 0, 0), question(append(append([]byte{64}, make([]byte, 64)...), 0), 1, 1)), dns.RcodeFormatError},
		{"compression loop", cat(hdr(7, 0x0100, 1, 0, 0, 0), question([]byte{0xc0, 12}, 1, 1)), dns.RcodeFormatError},
		{"pointer forward", cat(hdr(7, 0x0100, 1, 0, 0, 0), question([]byte{0xc0, 40}, 1, 1)), dns.RcodeFormatError},
		{"class CHAOS", cat(hdr(7, 0x0100, 1, 0, 0, 0), question([]byte("\x07version\x04bind\x00"), dns.TypeTXT, dns.ClassCHAOS)), dns.RcodeRefused},
		{"class ANY", cat(hdr(7, 0x0100, 1, 0, 0, 0), question(www, 1, dns.ClassANY)), dns.RcodeRefused},
		{"zone transfer", cat(hdr(7, 0x0100, 1, 0, 0, 0), question(www, dns.TypeAXFR, 1)), dns.RcodeRefused},
		{"OPT as question type", cat(hdr(7, 0x0100, 1, 0, 0, 0), question(www, dns.TypeOPT, 1)), dns.RcodeFormatError},
		{"opcode STATUS", cat(hdr(7, 2<<11, 1, 0, 0, 0), question(www, 1, 1)), dns.RcodeNotImplemented},
		{"opcode UPDATE", cat(hdr(7, 5<<11, 1, 0, 0, 0), question(www, 1, 1)), dns.RcodeNotImplemented},
		{"two OPT records", withOPT(newQuery("www.example.org.", dns.TypeA), 0, 2), dns.RcodeFormatError},
		{"EDNS version 1", withOPT(newQuery("www.example.org.", dns.TypeA), 1, 1), dns.RcodeBadVers},
		{"huge query", mustPack(t, long), dns.RcodeFormatError},
		{"trailing garbage count", cat(hdr(7, 0x0100, 1, 5, 0, 0), question(www, 1, 1)), dns.RcodeFormatError},
	}
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range tests {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				if proto == "tcp" && len(tc.pkt) > 65535 {
					t.Skip("does not fit a TCP frame")
				}
				replies := sendThenGood(t, proto, ts.addr, tc.pkt, good)
				last := replies[len(replies)-1]
				if last.Id != binary.BigEndian.Uint16(good) || last.Rcode != dns.RcodeSuccess {
					t.Fatalf("the good query after the bad one got %v; want its answer", last.MsgHdr)
				}
				if tc.rcode == drop {
					if len(replies) != 1 {
						t.Errorf("got a reply %v; want the packet dropped", replies[0].MsgHdr)
					}
					return
				}
				if len(replies) != 2 {
					t.Fatalf("no reply to the bad packet; want %s", dns.RcodeToString[tc.rcode])
				}
				r := replies[0]
				if r.Rcode != tc.rcode || !r.Response || r.Id != 7 && r.Id != binary.BigEndian.Uint16(tc.pkt) {
					t.Errorf("reply %v, want %s for ID %d", r.MsgHdr, dns.RcodeToString[tc.rcode], binary.BigEndian.Uint16(tc.pkt))
				}
			})
		}
	}
	if n := ts.logs.FilterMessage("dns query").FilterField(zap.String("result", "dropped")).Len(); n == 0 {
		t.Error("no 'dropped' log lines")
	}
}

// sendThenGood sends bad and then good from one socket (one TCP connection,
// or a new one when the server closed it) and returns the replies read until
// the one for good, which must come.
func sendThenGood(t *testing.T, proto string, addr netip.AddrPort, bad, good []byte) []*dns.Msg {
	t.Helper()
	var replies []*dns.Msg
	read := func(c net.Conn) ([]byte, error) {
		if proto == "udp" {
			b := make([]byte, 65535)
			n, err := c.Read(b)
			return b[:n], err
		}
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return nil, err
		}
		b := make([]byte, binary.BigEndian.Uint16(l[:]))
		_, err := io.ReadFull(c, b)
		return b, err
	}
	write := func(c net.Conn, b []byte) {
		if proto == "tcp" {
			b = append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	c, err := net.Dial(proto, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	write(c, bad)
	if proto == "tcp" {
		// The server either answers on this connection or closes it; only
		// then is the good query sent (on a fresh connection if needed).
		c.(*net.TCPConn).CloseWrite()
		b, err := read(c)
		if err == nil {
			replies = append(replies, unpack(t, b))
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("reading reply to the bad query: %v", err)
		}
		c2, err := net.Dial(proto, addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		c2.SetDeadline(time.Now().Add(10 * time.Second))
		c = c2
	}
	write(c, good)
	for {
		b, err := read(c)
		if err != nil {
			t.Fatalf("no answer to the good query: %v", err)
		}
		r := unpack(t, b)
		replies = append(replies, r)
		if r.Id == binary.BigEndian.Uint16(good) {
			return replies
		}
	}
}

func unpack(t testing.TB, b []byte) *dns.Msg {
	t.Helper()
	r := new(dns.Msg)
	if err := r.Unpack(b); err != nil {
		t.Fatalf("reply does not parse: %v (% x)", err, b)
	}
	return r
}

func mustPack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawExchange sends one packed query and returns the raw reply.
func rawExchange(t testing.TB, proto string, addr netip.AddrPort, q []byte) []byte {
	t.Helper()
	c, err := net.Dial(proto, addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if proto == "udp" {
		if _, err := c.Write(q); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 65535)
		n, err := c.Read(b)
		if err != nil {
			t.Fatal(err)
		}
		return b[:n]
	}
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		t.Fatal(err)
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestServeFlood(t *testing.T) {
	release := make(chan struct{})
	up := startUpstream(t, func(w dns.ResponseWriter, r *dns.Msg) {
		if r.Question[0].Name == "slow.test." {
			<-release
		}
		upstreamAnswer(w, r)
	})
	fwd, err := NewForwarder(ForwarderConfig{Servers: []netip.AddrPort{up.addr}, NoMark: true})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{MaxInflight: 2, MaxTCPConns: 2}, fwd)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	c, err := net.Dial("udp", ts.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	const flood = 10
	for i := 0; i < flood; i++ {
		m := newQuery("slow.test.", dns.TypeA)
		m.Id = uint16(100 + i)
		if _, err := c.Write(mustPack(t, m)); err != nil {
			t.Fatal(err)
		}
	}
	local := newQuery("echo.client-ns.svc.cluster.local.", dns.TypeA)
	local.Id = 1
	if _, err := c.Write(mustPack(t, local)); err != nil {
		t.Fatal(err)
	}
	refused, answeredLocal := 0, false
	buf := make([]byte, 65535)
	for !answeredLocal {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %d REFUSED, no answer to the local query: %v", refused, err)
		}
		r := unpack(t, buf[:n])
		switch {
		case r.Id == 1:
			answeredLocal = r.Rcode == dns.RcodeSuccess && len(r.Answer) == 1
		case r.Rcode == dns.RcodeRefused:
			refused++
		default:
			t.Fatalf("unexpected reply while the upstream is blocked: %v", r.MsgHdr)
		}
	}
	if refused != flood-2 {
		t.Errorf("%d of %d queries REFUSED with 2 in flight allowed, want %d", refused, flood, flood-2)
	}

	// Two TCP connections are served; a third is closed at once.
	for i := 0; i < 2; i++ {
		tc, err := net.Dial("tcp", ts.addr.String())
		if err != nil {
			t.Fatal(err)
		}
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		// An answered query proves the server registered the connection.
		dc := &dns.Conn{Conn: tc}
		if err := dc.WriteMsg(local); err != nil {
			t.Fatal(err)
		}
		if r, err := dc.ReadMsg(); err != nil || len(r.Answer) != 1 {
			t.Fatalf("TCP connection %d: %v, %v", i, r, err)
		}
	}
	third, err := net.Dial("tcp", ts.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	third.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil {
		t.Error("third TCP connection was not closed")
	}

	close(release)
	released = true
	got := 0
	for got < 2 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("%d of 2 in-flight queries answered after the upstream recovered: %v", got, err)
		}
		if r := unpack(t, buf[:n]); r.Rcode == dns.RcodeSuccess && r.Id >= 100 {
			got++
		}
	}
}

func TestCloseStopsServing(t *testing.T) {
	st := meshState(t)
	s, err := New(Config{ListenAddrs: []netip.AddrPort{loopback}}, Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addrs()[0]
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	// Without a forwarder, what is not local gets SERVFAIL; without a
	// WorkloadInfo and a workload on 127.0.0.1, every query does.
	r := exchange(t, "udp", addr, newQuery("echo.client-ns.svc.cluster.local.", dns.TypeA))
	if r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve returned %v after Close, want nil", err)
	}
	if c, err := net.Dial("tcp", addr.String()); err == nil {
		c.Close()
		t.Error("TCP listener still accepts after Close")
	}
	if err := s.Serve(context.Background()); err == nil {
		t.Error("second Serve succeeded")
	}
}

func TestNewBindErrors(t *testing.T) {
	st := state.NewStore()
	if _, err := New(Config{}, Deps{}); err == nil {
		t.Error("New without a store succeeded")
	}
	s1, err := New(Config{ListenAddrs: []netip.AddrPort{loopback}}, Deps{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	// A second server on the same address fails and leaves nothing open.
	if _, err := New(Config{ListenAddrs: []netip.AddrPort{loopback, s1.Addrs()[0]}}, Deps{Store: st}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("New on a taken port: %v, want EADDRINUSE", err)
	}
}

func TestNewForwarderResolvConf(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f, err := NewForwarder(ForwarderConfig{NoMark: true, ResolvConf: write("ok",
		"search ns.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5\n")})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("[fd00::a]:53")}
	if got := f.Servers(); !slices.Equal(got, want) {
		t.Errorf("servers %v, want %v", got, want)
	}
	if _, err := NewForwarder(ForwarderConfig{ResolvConf: write("empty", "search x\n")}); !errors.Is(err, ErrNoUpstream) {
		t.Errorf("resolv.conf without nameservers: %v, want ErrNoUpstream", err)
	}
	if _, err := NewForwarder(ForwarderConfig{ResolvConf: write("name", "nameserver dns.example.\n")}); err == nil {
		t.Error("a nameserver that is not an IP was accepted")
	}
	if _, err := NewForwarder(ForwarderConfig{ResolvConf: dir + "/missing"}); err == nil {
		t.Error("a missing resolv.conf was accepted")
	}
}
