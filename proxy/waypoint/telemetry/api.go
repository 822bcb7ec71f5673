package telemetry

import (
	"fmt"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// The metric families a Telemetry override names, in the order of the
// Telemetry API's IstioMetric (REQUEST_COUNT is 1): family = metric - 1.
const (
	famRequests = iota
	famDuration
	famReqBytes
	famRespBytes
	famTCPOpened
	famTCPClosed
	famTCPSent
	famTCPReceived
	nFam
)

// oursBit marks, in a series' family mask, the route metrics (ours); bits
// 0..3 are the request families, and for TCP bits 0..3 the four TCP
// families. A zero mask means every family.
const (
	oursBit = 1 << 4
	allHTTP = 0xf | oursBit
	allTCP  = 0xf
)

// tagOp is one compiled tag override.
type tagOp struct {
	idx     int // position in requestLabels
	remove  bool
	attr    waypointapi.Attribute
	header  string // canonical MIME header name
	literal string
}

// group is a set of families that share one label set per request.
type group struct {
	mask uint8
	ops  []tagOp
}

// Config is one compiled Telemetry API configuration (waypointapi
// Telemetry): the metric overrides and the access log sinks the stats
// step applies to a request. nil is the default (standard metrics, no
// access log provider). Immutable once compiled.
type Config struct {
	raw      *waypointapi.Telemetry
	disabled [nFam]bool
	sig      [nFam]string // per family: disabled and tag overrides, to see what changed
	// custom: some family is disabled or has tag overrides; otherwise the
	// default path (one series lookup per request) is taken.
	custom                bool
	httpGroups, tcpGroups []group
	logs                  []*logSink
	filter                []*waypointapi.LogCondition
	filterCode            []int64 // parsed numeric values of filter
}

// Raw returns the configuration as received.
func (c *Config) Raw() *waypointapi.Telemetry {
	if c == nil {
		return nil
	}
	return c.raw
}

// Compile compiles t (nil: nil). The access log files it names are opened
// once and kept by the Recorder; a file that cannot be opened is logged and
// skipped.
func (rec *Recorder) Compile(t *waypointapi.Telemetry) *Config {
	if t == nil {
		return nil
	}
	c := &Config{raw: t}
	var ops [nFam][]tagOp
	for _, o := range t.GetMetricOverrides() {
		f := int(o.GetMetric()) - 1
		if f < 0 || f >= nFam {
			continue // ALL_METRICS is expanded by the control plane; gRPC message counts are not ours
		}
		c.disabled[f] = o.GetDisabled()
		for _, tg := range o.GetTags() {
			i := slices.Index(requestLabels, tg.GetName())
			if i < 0 || f >= famTCPOpened && i >= nTCP {
				continue
			}
			op := tagOp{idx: i, remove: tg.GetRemove()}
			if v := tg.GetValue(); v != nil && !op.remove {
				op.attr, op.literal = v.GetAttribute(), v.GetLiteral()
				op.header = textproto.CanonicalMIMEHeaderKey(v.GetHeader())
			}
			ops[f] = append(ops[f], op)
		}
	}
	for f := range nFam {
		c.sig[f] = fmt.Sprint(c.disabled[f], ops[f])
		if c.disabled[f] || len(ops[f]) > 0 {
			c.custom = true
		}
	}
	c.httpGroups = groups(c, ops[:famTCPOpened], 0)
	c.tcpGroups = groups(c, ops[famTCPOpened:], famTCPOpened)
	// The route metrics (ours) follow the group without overrides.
	idx := slices.IndexFunc(c.httpGroups, func(g group) bool { return len(g.ops) == 0 })
	if idx < 0 {
		c.httpGroups = append(c.httpGroups, group{})
		idx = len(c.httpGroups) - 1
	}
	c.httpGroups[idx].mask |= oursBit
	// A group of every family is the default path's entry (mask 0): the
	// same label set must not have two entries sharing its series.
	for _, gs := range []struct {
		g   []group
		all uint8
	}{{c.httpGroups, allHTTP}, {c.tcpGroups, allTCP}} {
		for i := range gs.g {
			if gs.g[i].mask == gs.all {
				gs.g[i].mask = 0
			}
		}
	}

	if al := t.GetAccessLogging(); al != nil {
		c.filter = al.GetFilter()
		c.filterCode = make([]int64, len(c.filter))
		for i, f := range c.filter {
			c.filterCode[i], _ = strconv.ParseInt(f.GetValue(), 10, 64)
		}
		for _, p := range al.GetProviders() {
			if s := rec.sink(p); s != nil {
				c.logs = append(c.logs, s)
			}
		}
	}
	return c
}

// groups puts the enabled families of one kind with equal overrides in
// one group.
func groups(c *Config, ops [][]tagOp, base int) []group {
	var out []group
	for i, o := range ops {
		if c.disabled[base+i] {
			continue
		}
		j := slices.IndexFunc(out, func(g group) bool { return slices.Equal(g.ops, o) })
		if j < 0 {
			out = append(out, group{ops: o})
			j = len(out) - 1
		}
		out[j].mask |= 1 << i
	}
	return out
}

// Activate makes c the waypoint-wide configuration: the series of every
// family whose overrides changed since the last one are deleted (a
// disabled metric leaves /metrics at once; a label change starts new
// series), and the label-set cache is emptied so no entry keeps a deleted
// series. It returns the generation now in force, for the Entry of every
// request served under c; a change that deleted series starts a new one.
func (rec *Recorder) Activate(c *Config) uint64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var sig [nFam]string
	if c != nil {
		sig = c.sig
	}
	var changed bool
	for f := range nFam {
		prev := rec.active[f]
		if prev == "" {
			prev = fmt.Sprint(false, []tagOp(nil))
		}
		cur := sig[f]
		if cur == "" {
			cur = fmt.Sprint(false, []tagOp(nil))
		}
		if prev != cur {
			rec.m.family(f).Reset()
			changed = true
		}
	}
	rec.active = sig
	if changed {
		rec.series.flush()
		return rec.gen.Add(1)
	}
	return rec.gen.Load()
}

type resetter interface{ Reset() }

func (m *metrics) family(f int) resetter {
	switch f {
	case famRequests:
		return m.requests
	case famDuration:
		return m.duration
	case famReqBytes:
		return m.reqBytes
	case famRespBytes:
		return m.respBytes
	case famTCPOpened:
		return m.tcpOpened
	case famTCPClosed:
		return m.tcpClosed
	case famTCPSent:
		return m.tcpSent
	}
	return m.tcpReceived
}

// apply sets the overridden labels of lv (a request or TCP label set).
func apply(lv []string, ops []tagOp, ex *Entry) {
	for i := range ops {
		op := &ops[i]
		if op.idx >= len(lv) {
			continue
		}
		switch {
		case op.remove:
			// Prometheus treats an empty label as an absent one.
			lv[op.idx] = ""
		case op.attr == waypointapi.Attribute_ATTRIBUTE_UNSPECIFIED:
			lv[op.idx] = op.literal
		default:
			lv[op.idx] = attribute(ex, op.attr, op.header)
		}
	}
}

// attribute is a request attribute's value ("" when absent); no
// allocation but for RESPONSE_DURATION_MS.
func attribute(ex *Entry, a waypointapi.Attribute, header string) string {
	at := ex.Attrs
	switch a {
	case waypointapi.Attribute_REQUEST_HEADER:
		if ex.Req != nil {
			if vs := ex.Req.Header[header]; len(vs) > 0 {
				return vs[0]
			}
		}
		return ""
	case waypointapi.Attribute_REQUEST_HOST:
		return at.Host
	case waypointapi.Attribute_REQUEST_METHOD:
		return at.Method
	case waypointapi.Attribute_REQUEST_PATH:
		if ex.Req != nil && ex.Req.URL != nil && ex.Req.URL.RawQuery != "" && !strings.Contains(at.Path, "?") {
			return ex.Req.RequestURI
		}
		return at.Path
	case waypointapi.Attribute_REQUEST_URL_PATH:
		p, _, _ := strings.Cut(at.Path, "?")
		return p
	case waypointapi.Attribute_REQUEST_SCHEME:
		if ex.Req != nil && ex.Req.TLS != nil {
			return "https"
		}
		return "http"
	case waypointapi.Attribute_REQUEST_PROTOCOL:
		if ex.Req != nil {
			return ex.Req.Proto
		}
		return ""
	case waypointapi.Attribute_RESPONSE_CODE:
		return codeLabel(ex.Code)
	case waypointapi.Attribute_RESPONSE_DURATION_MS:
		return strconv.FormatInt(ex.Duration.Milliseconds(), 10)
	}
	return ""
}

// logged reports whether the access log filter lets ex through.
func (c *Config) logged(ex *Entry) bool {
	for i, f := range c.filter {
		var ok bool
		switch f.GetAttribute() {
		case waypointapi.Attribute_RESPONSE_CODE, waypointapi.Attribute_RESPONSE_DURATION_MS:
			v := int64(ex.Code)
			if f.GetAttribute() == waypointapi.Attribute_RESPONSE_DURATION_MS {
				v = ex.Duration.Milliseconds()
			}
			ok = compare(v, c.filterCode[i], f.GetOp())
		default:
			s := attribute(ex, f.GetAttribute(), textproto.CanonicalMIMEHeaderKey(f.GetHeader()))
			eq := s == f.GetValue()
			ok = eq == (f.GetOp() == waypointapi.LogCondition_EQ)
		}
		if !ok {
			return false
		}
	}
	return true
}

func compare(a, b int64, op waypointapi.LogCondition_Op) bool {
	switch op {
	case waypointapi.LogCondition_EQ:
		return a == b
	case waypointapi.LogCondition_NE:
		return a != b
	case waypointapi.LogCondition_LT:
		return a < b
	case waypointapi.LogCondition_LE:
		return a <= b
	case waypointapi.LogCondition_GT:
		return a > b
	}
	return a >= b
}

// logSink is one access log provider.
type logSink struct {
	name   string
	file   *os.File      // a file provider, or
	otel   *otelExport   // an OTLP one
	text   []segment     // nil with labels
	labels []labelFormat // JSON
}

type labelFormat struct {
	key string
	fmt []segment
}

// sink returns the sink of provider p, opening its file once.
func (rec *Recorder) sink(p *waypointapi.AccessLogProvider) *logSink {
	var s *logSink
	var format *waypointapi.LogFormat
	switch {
	case p.GetFile() != nil:
		f := p.GetFile()
		file, err := rec.openLog(f.GetPath())
		if err != nil {
			rec.warnOnce("access log provider "+p.GetName(), err)
			return nil
		}
		s, format = &logSink{name: p.GetName(), file: file}, f.GetFormat()
	case p.GetOtel() != nil:
		e, err := rec.otelFor(p.GetOtel())
		if err != nil {
			rec.warnOnce("access log provider "+p.GetName(), err)
			return nil
		}
		s, format = &logSink{name: p.GetName(), otel: e}, p.GetOtel().GetFormat()
	default:
		rec.warnOnce("access log provider "+p.GetName()+": kind not implemented here", nil)
		return nil
	}
	keys := make([]string, 0, len(format.GetLabels()))
	for k := range format.GetLabels() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		s.labels = append(s.labels, labelFormat{key: k, fmt: parseFormat(format.GetLabels()[k])})
	}
	switch {
	case s.otel != nil && format.GetText() != "":
		s.text = parseFormat(format.GetText())
	case s.otel != nil:
		// The body of an OTLP record: Istio's default format, one line.
		s.text = parseFormat(strings.TrimSuffix(defaultFormatText, "\n"))
	case len(keys) > 0:
		// A file with labels writes one JSON object per record.
	case format.GetText() != "":
		text := format.GetText()
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		s.text = parseFormat(text)
	default:
		s.text = defaultFormat
	}
	return s
}

func (rec *Recorder) openLog(path string) (*os.File, error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch path {
	case "", "/dev/stdout":
		return os.Stdout, nil
	case "/dev/stderr":
		return os.Stderr, nil
	}
	if f := rec.files[path]; f != nil {
		return f, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	rec.files[path] = f
	return f, nil
}

func (rec *Recorder) warnOnce(msg string, err error) {
	rec.mu.Lock()
	seen := rec.warned[msg]
	rec.warned[msg] = true
	rec.mu.Unlock()
	if !seen {
		rec.log.Warn(msg, zap.Error(err))
	}
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// write renders ex in the sink's format and writes it with one write
// (whole lines: concurrent writers do not interleave in an O_APPEND file).
func (s *logSink) write(ex *Entry, proto, flags string) {
	if s.otel != nil {
		s.emitOTel(ex, proto, flags)
		return
	}
	bp := bufPool.Get().(*[]byte)
	b := (*bp)[:0]
	if s.labels != nil {
		b = append(b, '{')
		for i, l := range s.labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, l.key)
			b = append(b, ':')
			v := render(nil, l.fmt, ex, proto, flags)
			b = strconv.AppendQuote(b, string(v))
		}
		b = append(b, '}', '\n')
	} else {
		b = render(b, s.text, ex, proto, flags)
	}
	_, _ = s.file.Write(b)
	*bp = b
	bufPool.Put(bp)
}
