package dnsproxy

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

const (
	protoUDP = "udp"
	protoTCP = "tcp"

	rcodeFormErr  = dns.RcodeFormatError
	rcodeServFail = dns.RcodeServerFailure
	rcodeNotImp   = dns.RcodeNotImplemented
	rcodeRefused  = dns.RcodeRefused
	rcodeBadVers  = dns.RcodeBadVers

	// ourUDPSize is the EDNS UDP payload size this server advertises.
	ourUDPSize = 1232
)

// Outcomes in the per-query log line.
const (
	outcomeAnswered  = "answered"
	outcomeNoRecords = "no records"
	outcomeForwarded = "forwarded"
	outcomeFailed    = "failed"
	outcomeRefused   = "refused"
	outcomeFormErr   = "formerr"
	outcomeNotImp    = "notimp"
)

// query is one request being handled. The UDP reader and each TCP
// connection reuse one; forwarded queries get their own copy (clone).
type query struct {
	proto  string
	src    netip.AddrPort
	start  time.Time
	msg    dns.Msg
	raw    []byte // the packed query; set by clone, for forwarding
	client *state.Workload
	labels labelValues
	qname  string
	qtype  uint16
	edns   bool
	// size is the largest reply the client accepts: its EDNS UDP size (at
	// least 512) over UDP, 65535 over TCP.
	size int
}

func (q *query) reset(proto string, src netip.AddrPort) {
	*q = query{proto: proto, src: src, start: time.Now(), size: dns.MinMsgSize}
	if proto == protoTCP {
		q.size = dns.MaxMsgSize
	}
	q.labels = newLabels(0, proto, nil)
}

// clone copies q for a forward that outlives the reader's buffers. The
// message's slices are not shared with later queries: Unpack allocates new
// ones.
func (q *query) clone(raw []byte) *query {
	c := *q
	c.raw = bytes.Clone(raw)
	return &c
}

// decide handles everything that needs no upstream: it returns the reply to
// write (packed into out when it fits), or fwd=true when the query must be
// forwarded, or neither when the packet is dropped.
func (s *Server) decide(raw []byte, q *query, out []byte) (reply []byte, fwd bool) {
	switch {
	case len(raw) < 12:
		s.logDrop(q.src, q.proto, "dropped: shorter than a DNS header")
		return nil, false
	case raw[2]&0x80 != 0:
		// A response: never answer one (no reflection loops).
		s.logDrop(q.src, q.proto, "dropped: not a query")
		return nil, false
	case len(raw) > maxQuery:
		return s.headerReply(q, raw, rcodeFormErr, outcomeFormErr, "query too large", out), false
	case (raw[2]>>3)&0x0f != dns.OpcodeQuery:
		return s.headerReply(q, raw, rcodeNotImp, outcomeNotImp, "opcode not supported", out), false
	}
	if err := q.msg.Unpack(raw); err != nil {
		return s.headerReply(q, raw, rcodeFormErr, outcomeFormErr, err.Error(), out), false
	}
	if len(q.msg.Question) != 1 {
		return s.headerReply(q, raw, rcodeFormErr, outcomeFormErr, "not exactly one question", out), false
	}
	if !countsMatch(raw, &q.msg) {
		// Unpack forgives sections that end early; a query whose header
		// lies is not forwarded.
		return s.headerReply(q, raw, rcodeFormErr, outcomeFormErr, "section counts do not match the message", out), false
	}
	qs := q.msg.Question[0]
	q.qname, q.qtype = qs.Name, qs.Qtype
	q.labels[0] = qtypeLabel(q.qtype)
	opt, ok := findOPT(&q.msg)
	if !ok {
		return s.reject(q, rcodeFormErr, "formerr: misplaced or repeated OPT record", out), false
	}
	if opt != nil {
		q.edns = true
		if q.proto == protoUDP && int(opt.UDPSize()) > q.size {
			q.size = int(opt.UDPSize())
		}
		if opt.Version() != 0 {
			return s.reject(q, rcodeBadVers, "refused: unsupported EDNS version", out), false
		}
	}
	switch {
	case qs.Qclass != dns.ClassINET:
		return s.reject(q, rcodeRefused, "refused: class is not IN", out), false
	case qs.Qtype == dns.TypeAXFR || qs.Qtype == dns.TypeIXFR:
		return s.reject(q, rcodeRefused, "refused: zone transfer", out), false
	case qs.Qtype == dns.TypeOPT || qs.Qtype == dns.TypeTSIG || qs.Qtype == dns.TypeTKEY:
		return s.reject(q, rcodeFormErr, "formerr: meta type in question", out), false
	}
	snap := s.store.Load()
	q.client = s.client(snap, q.src.Addr())
	q.labels = newLabels(q.qtype, q.proto, q.client)
	if q.client == nil {
		return s.reject(q, rcodeServFail, "failed: unknown client workload", out), false
	}
	ans := s.cfg.Resolver.Resolve(snap, q.client, q.qname, q.qtype)
	if !ans.Found {
		return nil, true
	}
	s.metrics.request(q.labels)
	r := s.newReply(q, dns.RcodeSuccess)
	r.Authoritative = true
	for _, c := range ans.CNAMEs {
		r.Answer = append(r.Answer, &dns.CNAME{Hdr: rrHeader(c.Name, dns.TypeCNAME), Target: c.Target})
	}
	rand.Shuffle(len(ans.Addrs), func(i, j int) { ans.Addrs[i], ans.Addrs[j] = ans.Addrs[j], ans.Addrs[i] })
	for _, a := range ans.Addrs {
		if a.Is4() {
			b := a.As4()
			r.Answer = append(r.Answer, &dns.A{Hdr: rrHeader(ans.Owner, dns.TypeA), A: net.IP(b[:])})
		} else {
			b := a.As16()
			r.Answer = append(r.Answer, &dns.AAAA{Hdr: rrHeader(ans.Owner, dns.TypeAAAA), AAAA: net.IP(b[:])})
		}
	}
	outcome := outcomeAnswered
	if len(ans.Addrs) == 0 {
		outcome = outcomeNoRecords
	}
	reply = s.pack(q, r, out)
	if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
		svc := ""
		if ans.Service != nil {
			svc = ans.Service.Key
		}
		ce.Write(append(s.queryFields(q, outcome, dns.RcodeSuccess, len(r.Answer)), zap.String("service", svc))...)
	}
	return reply, false
}

func countsMatch(raw []byte, m *dns.Msg) bool {
	return int(binary.BigEndian.Uint16(raw[4:])) == len(m.Question) &&
		int(binary.BigEndian.Uint16(raw[6:])) == len(m.Answer) &&
		int(binary.BigEndian.Uint16(raw[8:])) == len(m.Ns) &&
		int(binary.BigEndian.Uint16(raw[10:])) == len(m.Extra)
}

// findOPT returns the request's OPT record; ok is false when there is more
// than one or one outside the additional section (RFC 6891 §6.1.1).
func findOPT(m *dns.Msg) (opt *dns.OPT, ok bool) {
	for _, rr := range m.Answer {
		if rr.Header().Rrtype == dns.TypeOPT {
			return nil, false
		}
	}
	for _, rr := range m.Ns {
		if rr.Header().Rrtype == dns.TypeOPT {
			return nil, false
		}
	}
	for _, rr := range m.Extra {
		if o, isOPT := rr.(*dns.OPT); isOPT {
			if opt != nil {
				return nil, false
			}
			opt = o
		}
	}
	return opt, true
}

func rrHeader(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: TTL}
}

// newReply starts a reply to q's message with rcode, with an OPT record when
// the query had one.
func (s *Server) newReply(q *query, rcode int) *dns.Msg {
	r := new(dns.Msg)
	r.SetRcode(&q.msg, rcode)
	r.RecursionAvailable = true
	if q.edns {
		r.SetEdns0(ourUDPSize, false)
	}
	return r
}

// pack packs r for q's transport, truncating (TC) to the client's size over
// UDP.
func (s *Server) pack(q *query, r *dns.Msg, out []byte) []byte {
	if q.proto == protoUDP {
		r.Truncate(q.size)
	}
	b, err := r.PackBuffer(out[:cap(out)])
	if err != nil {
		s.log.Debug("pack reply", zap.Error(err))
		return rawHeader(q.msg.Id, q.msg.Opcode, q.msg.RecursionDesired, rcodeServFail)
	}
	return b
}

// reject answers a parsed query with an error rcode and logs the reason.
func (s *Server) reject(q *query, rcode int, reason string, out []byte) []byte {
	s.metrics.request(q.labels)
	reply := s.pack(q, s.newReply(q, rcode), out)
	if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
		ce.Write(append(s.queryFields(q, outcomeOf(rcode), rcode, 0), zap.String("reason", reason))...)
	}
	return reply
}

// headerReply answers a query that could not be parsed with a bare header:
// its ID, opcode and RD, QR set and rcode.
func (s *Server) headerReply(q *query, raw []byte, rcode int, outcome, reason string, out []byte) []byte {
	s.metrics.request(q.labels)
	if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
		ce.Write(zap.String("src.addr", q.src.String()), zap.String("protocol", q.proto),
			zap.String("result", outcome), zap.String("rcode", dns.RcodeToString[rcode]), zap.String("reason", reason))
	}
	id := binary.BigEndian.Uint16(raw)
	return append(out[:0], rawHeader(id, int(raw[2]>>3)&0x0f, raw[2]&0x01 != 0, rcode)...)
}

func rawHeader(id uint16, opcode int, rd bool, rcode int) []byte {
	h := make([]byte, 12)
	binary.BigEndian.PutUint16(h, id)
	h[2] = 0x80 | byte(opcode&0x0f)<<3
	if rd {
		h[2] |= 0x01
	}
	h[3] = 0x80 | byte(rcode&0x0f) // RA
	return h
}

func outcomeOf(rcode int) string {
	switch rcode {
	case rcodeFormErr:
		return outcomeFormErr
	case rcodeNotImp:
		return outcomeNotImp
	case rcodeServFail:
		return outcomeFailed
	}
	return outcomeRefused
}

// forward sends q upstream and writes the answer (or SERVFAIL) with write.
func (s *Server) forward(q *query, write func([]byte)) {
	if s.fwd == nil {
		write(s.reject(q, rcodeServFail, "failed: no upstream configured", nil))
		return
	}
	bufp := s.fwd.getBuf()
	defer s.fwd.putBuf(bufp)
	start := time.Now()
	n, err := s.fwd.exchange(s.ctx, s.up, q.raw, *bufp)
	s.metrics.request(q.labels)
	s.metrics.upstream(q.labels, time.Since(start), err != nil)
	if err != nil {
		if s.ctx.Err() != nil {
			return // shutting down: the client will retry elsewhere
		}
		if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
			ce.Write(append(s.queryFields(q, outcomeFailed, rcodeServFail, 0), zap.Error(err))...)
		}
		write(s.pack(q, s.newReply(q, rcodeServFail), nil))
		return
	}
	resp := (*bufp)[:n]
	if q.proto == protoUDP && n > q.size {
		var m dns.Msg
		if err := m.Unpack(resp); err != nil {
			if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
				ce.Write(append(s.queryFields(q, outcomeFailed, rcodeServFail, 0), zap.NamedError("error", err))...)
			}
			write(s.pack(q, s.newReply(q, rcodeServFail), nil))
			return
		}
		resp = s.pack(q, &m, nil)
	}
	if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
		ce.Write(s.queryFields(q, outcomeForwarded, int(resp[3]&0x0f), int(binary.BigEndian.Uint16(resp[6:])))...)
	}
	write(resp)
}

func (s *Server) logDrop(src netip.AddrPort, proto, reason string) {
	if ce := s.log.Check(zap.DebugLevel, "dns query"); ce != nil {
		ce.Write(zap.String("src.addr", src.String()), zap.String("protocol", proto), zap.String("result", "dropped"), zap.String("reason", reason))
	}
}

func (s *Server) queryFields(q *query, outcome string, rcode, answers int) []zap.Field {
	wl, ns := "unknown", "unknown"
	if q.client != nil {
		wl, ns = q.client.Name, q.client.Namespace
	}
	return []zap.Field{
		zap.String("src.addr", q.src.String()),
		zap.String("src.workload", wl),
		zap.String("src.namespace", ns),
		zap.String("protocol", q.proto),
		zap.String("query", dns.TypeToString[q.qtype]),
		zap.String("domain", q.qname),
		zap.String("result", outcome),
		zap.String("rcode", dns.RcodeToString[rcode]),
		zap.Int("answers", answers),
		zap.Duration("duration", time.Since(q.start)),
	}
}
