package tracing

import (
	"encoding/hex"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// The trace context headers, canonical (net/http's header keys).
const (
	hTraceparent  = "Traceparent"
	hTracestate   = "Tracestate"
	hB3           = "B3"
	hB3TraceID    = "X-B3-Traceid"
	hB3SpanID     = "X-B3-Spanid"
	hB3ParentID   = "X-B3-Parentspanid"
	hB3Sampled    = "X-B3-Sampled"
	hB3Flags      = "X-B3-Flags"
	hRequestID    = "X-Request-Id"
	hUserAgent    = "User-Agent"
	uuidLen       = 36
	traceparentV0 = 55 // "00-" 32 "-" 16 "-" 2
)

// decision is whose sampling decision a request follows.
type decision uint8

const (
	decideLocal  decision = iota // none came: the random sampling percentage decides
	decideParent                 // the parent's sampled flag (traceparent, B3 with a sampling state)
	decideSample                 // a decision alone ("b3: 1", "X-B3-Sampled: 1", "X-B3-Flags: 1")
	decideDrop                   // a decision alone ("b3: 0", "X-B3-Sampled: 0")
)

// incoming is the trace context a request arrived with.
type incoming struct {
	parent     trace.SpanContext // invalid: none (a new trace)
	tracestate string            // W3C tracestate, passed on unchanged
	decision   decision          // for a request without a parent
	singleB3   bool              // it came as the single b3 header: answered in kind
}

// extract reads the incoming trace context, in Envoy's order of
// precedence: W3C traceparent, else B3 (single header, then multiple
// headers). A malformed header is ignored (a new trace starts), as Envoy
// does.
func extract(h http.Header) incoming {
	var in incoming
	if tp := first(h, hTraceparent); tp != "" {
		if sc, ok := parseTraceparent(tp); ok {
			in.parent, in.decision = sc, decideParent
			in.tracestate = strings.Join(h[hTracestate], ",")
			return in
		}
	}
	if b3 := first(h, hB3); b3 != "" {
		in.singleB3 = true
		in.parent, in.decision = parseB3Single(b3)
		return in
	}
	if tid, sid := first(h, hB3TraceID), first(h, hB3SpanID); tid != "" && sid != "" {
		t, okT := parseTraceID(tid)
		s, okS := parseSpanID(sid)
		if okT && okS {
			flags := trace.TraceFlags(0)
			smp, dbg := first(h, hB3Sampled), first(h, hB3Flags) == "1"
			if b3Sampled(smp) || dbg {
				flags = trace.FlagsSampled
			}
			in.parent = trace.NewSpanContext(trace.SpanContextConfig{TraceID: t, SpanID: s, TraceFlags: flags, Remote: true})
			if smp != "" || dbg {
				in.decision = decideParent
			}
			return in
		}
	}
	if s := first(h, hB3Sampled); s != "" {
		in.decision = decideDrop
		if b3Sampled(s) {
			in.decision = decideSample
		}
	}
	if first(h, hB3Flags) == "1" {
		in.decision = decideSample
	}
	return in
}

func first(h http.Header, k string) string {
	if vs := h[k]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func b3Sampled(s string) bool { return s == "1" || s == "true" || s == "d" }

// parseTraceparent reads "00-<trace id>-<span id>-<flags>" (a later
// version's first four fields too, as the W3C spec asks).
func parseTraceparent(s string) (trace.SpanContext, bool) {
	if len(s) < traceparentV0 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return trace.SpanContext{}, false
	}
	ver := s[:2]
	if ver == "ff" || (ver == "00" && len(s) != traceparentV0) || (len(s) > traceparentV0 && s[55] != '-') {
		return trace.SpanContext{}, false
	}
	t, okT := parseTraceID(s[3:35])
	sp, okS := parseSpanID(s[36:52])
	var fl [1]byte
	if _, err := hex.Decode(fl[:], []byte(s[53:55])); err != nil || !okT || !okS {
		return trace.SpanContext{}, false
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: t, SpanID: sp,
		TraceFlags: trace.TraceFlags(fl[0]) & trace.FlagsSampled, Remote: true}), true
}

// parseB3Single reads the single b3 header:
// "{trace id}-{span id}[-{sampling}[-{parent span id}]]", or a decision
// alone ("0", "1", "d").
func parseB3Single(s string) (trace.SpanContext, decision) {
	switch s {
	case "0":
		return trace.SpanContext{}, decideDrop
	case "1", "d":
		return trace.SpanContext{}, decideSample
	}
	parts := strings.SplitN(s, "-", 4)
	if len(parts) < 2 {
		return trace.SpanContext{}, decideLocal
	}
	t, okT := parseTraceID(parts[0])
	sp, okS := parseSpanID(parts[1])
	if !okT || !okS {
		return trace.SpanContext{}, decideLocal
	}
	cfg := trace.SpanContextConfig{TraceID: t, SpanID: sp, Remote: true}
	if len(parts) < 3 {
		// No sampling state: B3 defers the decision to the receiver.
		return trace.NewSpanContext(cfg), decideLocal
	}
	if b3Sampled(parts[2]) {
		cfg.TraceFlags = trace.FlagsSampled
	}
	return trace.NewSpanContext(cfg), decideParent
}

// parseTraceID reads 32 hex digits, or B3's 16 (the high half zero).
func parseTraceID(s string) (trace.TraceID, bool) {
	var t trace.TraceID
	switch len(s) {
	case 32:
		if _, err := hex.Decode(t[:], []byte(s)); err != nil {
			return t, false
		}
	case 16:
		if _, err := hex.Decode(t[8:], []byte(s)); err != nil {
			return t, false
		}
	default:
		return t, false
	}
	return t, t.IsValid()
}

func parseSpanID(s string) (trace.SpanID, bool) {
	var sp trace.SpanID
	if len(s) != 16 {
		return sp, false
	}
	if _, err := hex.Decode(sp[:], []byte(s)); err != nil {
		return sp, false
	}
	return sp, sp.IsValid()
}

// inject writes sc as the upstream request's trace context: W3C
// traceparent (and the tracestate that came in), B3's multiple headers,
// and the single b3 header when the request came with one. parent is the
// waypoint span's own parent (B3's X-B3-ParentSpanId), invalid for a root.
func inject(h http.Header, sc trace.SpanContext, parent trace.SpanID, in *incoming) {
	tid, sid := sc.TraceID().String(), sc.SpanID().String()
	sampled := "0"
	flags := "00"
	if sc.IsSampled() {
		sampled, flags = "1", "01"
	}
	h[hTraceparent] = []string{"00-" + tid + "-" + sid + "-" + flags}
	if in.tracestate != "" {
		h[hTracestate] = []string{in.tracestate}
	} else {
		delete(h, hTracestate)
	}
	h[hB3TraceID] = []string{tid}
	h[hB3SpanID] = []string{sid}
	h[hB3Sampled] = []string{sampled}
	delete(h, hB3Flags)
	if parent.IsValid() {
		h[hB3ParentID] = []string{parent.String()}
	} else {
		delete(h, hB3ParentID)
	}
	if in.singleB3 {
		v := tid + "-" + sid + "-" + sampled
		if parent.IsValid() {
			v += "-" + parent.String()
		}
		h[hB3] = []string{v}
	}
}
