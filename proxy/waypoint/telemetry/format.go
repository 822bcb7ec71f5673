package telemetry

import (
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// segment is a piece of an Envoy access log format string: literal text,
// or a command operator (%NAME% or %NAME(arg)%).
type segment struct {
	lit string
	op  string
	// arg of REQ/RESP: the header (canonical), alt the fallback after "?".
	arg, alt string
	// pseudo: arg is a pseudo-header (:method, :path, :authority).
	pseudo, altPseudo string
}

// defaultFormatText is Istio's default access log format (Envoy's text
// format, meshConfig.accessLogFormat unset).
const defaultFormatText = `[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" ` +
	`%RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% ` +
	`"%UPSTREAM_TRANSPORT_FAILURE_REASON%" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% ` +
	`%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" ` +
	`"%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% ` +
	`%DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%` + "\n"

var defaultFormat = parseFormat(defaultFormatText)

// parseFormat splits an Envoy format string. An unknown operator renders
// as "-" (as Envoy renders a value it does not have).
func parseFormat(s string) []segment {
	var out []segment
	for s != "" {
		i := strings.IndexByte(s, '%')
		if i < 0 {
			out = append(out, segment{lit: s})
			break
		}
		j := strings.IndexByte(s[i+1:], '%')
		if j < 0 {
			out = append(out, segment{lit: s})
			break
		}
		if i > 0 {
			out = append(out, segment{lit: s[:i]})
		}
		cmd := s[i+1 : i+1+j]
		s = s[i+2+j:]
		if cmd == "" {
			out = append(out, segment{lit: "%"})
			continue
		}
		seg := segment{op: cmd}
		if k := strings.IndexByte(cmd, '('); k > 0 && strings.HasSuffix(cmd, ")") {
			seg.op = cmd[:k]
			arg := cmd[k+1 : len(cmd)-1]
			arg, _, _ = strings.Cut(arg, ")") // a length limit "(...):N" is not applied
			a, b, _ := strings.Cut(arg, "?")
			seg.arg, seg.pseudo = header(a)
			seg.alt, seg.altPseudo = header(b)
		}
		out = append(out, seg)
	}
	return out
}

func header(h string) (canonical, pseudo string) {
	if h == "" {
		return "", ""
	}
	if h[0] == ':' {
		return "", strings.ToLower(h)
	}
	return textproto.CanonicalMIMEHeaderKey(h), ""
}

// render appends the formatted record of ex to b.
func render(b []byte, f []segment, ex *Entry, proto, flags string) []byte {
	for i := range f {
		s := &f[i]
		if s.op == "" {
			b = append(b, s.lit...)
			continue
		}
		v, num, isNum := operator(s, ex, proto, flags)
		switch {
		case isNum:
			b = strconv.AppendInt(b, num, 10)
		case v == "":
			b = append(b, '-')
		default:
			b = append(b, v...)
		}
	}
	return b
}

func operator(s *segment, ex *Entry, proto, flags string) (string, int64, bool) {
	switch s.op {
	case "START_TIME":
		return time.Now().Add(-ex.Duration).UTC().Format("2006-01-02T15:04:05.000Z"), 0, false
	case "REQ":
		if v := reqHeader(ex, s.arg, s.pseudo); v != "" {
			return v, 0, false
		}
		return reqHeader(ex, s.alt, s.altPseudo), 0, false
	case "PROTOCOL":
		if ex.Req != nil {
			return ex.Req.Proto, 0, false
		}
		return "", 0, false
	case "RESPONSE_CODE":
		return "", int64(ex.Code), true
	case "RESPONSE_FLAGS":
		return flags, 0, false
	case "BYTES_RECEIVED":
		return "", ex.Sizes.RequestBody, true
	case "BYTES_SENT":
		return "", ex.Sizes.ResponseBody, true
	case "DURATION":
		return "", ex.Duration.Milliseconds(), true
	case "UPSTREAM_HOST":
		return ex.UpstreamAddress(), 0, false
	case "UPSTREAM_CLUSTER", "UPSTREAM_CLUSTER_RAW":
		if ex.Attrs.Service != "" {
			return "inbound-vip|" + strconv.Itoa(int(ex.Attrs.DstPort)) + "|http|" + ex.Attrs.Service, 0, false
		}
		return "", 0, false
	case "DOWNSTREAM_LOCAL_ADDRESS":
		return ex.Dst.String(), 0, false
	case "DOWNSTREAM_REMOTE_ADDRESS", "DOWNSTREAM_PEER_ADDRESS":
		return ex.Src.String(), 0, false
	case "DOWNSTREAM_PEER_URI_SAN":
		return ex.Peer.String(), 0, false
	case "ROUTE_NAME":
		return ex.Route, 0, false
	case "REQUEST_PROTOCOL":
		return proto, 0, false
	case "REQUESTED_SERVER_NAME", "RESPONSE_CODE_DETAILS", "CONNECTION_TERMINATION_DETAILS",
		"UPSTREAM_TRANSPORT_FAILURE_REASON", "UPSTREAM_LOCAL_ADDRESS", "RESP":
		return "", 0, false
	}
	return "", 0, false
}

func reqHeader(ex *Entry, h, pseudo string) string {
	switch pseudo {
	case ":method":
		return ex.Attrs.Method
	case ":path":
		return ex.Attrs.Path
	case ":authority":
		return ex.Attrs.Host
	case ":scheme":
		return "http"
	}
	if h == "" || ex.Req == nil {
		return ""
	}
	if vs := ex.Req.Header[h]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}
