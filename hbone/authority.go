package hbone

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
)

// ErrBadAuthority is wrapped by ParseAuthority failures.
var ErrBadAuthority = errors.New("authority is not ip:port")

// ParseAuthority parses a CONNECT :authority of the form ip:port, with IPv6
// in brackets ("[fd00::1]:80"), as Istio's ztunnel sends it. It rejects host
// names, zones, missing or zero ports and anything with extra characters.
func ParseAuthority(s string) (netip.AddrPort, error) {
	if len(s) == 0 || len(s) > len("[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535") {
		return netip.AddrPort{}, fmt.Errorf("hbone: %q: %w", s, ErrBadAuthority)
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("hbone: %q: %w", s, ErrBadAuthority)
	}
	if ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("hbone: %q: %w (zero port or zone)", s, ErrBadAuthority)
	}
	// netip accepts leading zeros in the port ("1.2.3.4:080"); Istio's peers
	// never send them, and a canonical form keeps logs and metrics unambiguous.
	if FormatAuthority(ap) != s {
		return netip.AddrPort{}, fmt.Errorf("hbone: %q: %w (not canonical)", s, ErrBadAuthority)
	}
	return ap, nil
}

// ErrBadHostAuthority is wrapped by ParseHostAuthority failures.
var ErrBadHostAuthority = errors.New("authority is not hostname:port")

// maxHostnameLen is DNS's limit on a name's text form (RFC 1035 2.3.4).
const maxHostnameLen = 253

// ParseHostAuthority parses a CONNECT :authority that names a service by
// hostname ("reviews.default.svc.cluster.local:9080"), as Istio 1.26 lets
// clients and gateways address a service without picking an endpoint. The
// host must be a DNS name of letters, digits and hyphens (RFC 1123 labels
// of 1-63 characters, 253 in all, no trailing dot) whose last label is not
// all digits, so no IP address in any spelling is taken for a name; it is
// returned in lower case, as service hostnames are. The port is decimal
// without leading zeros, 1-65535.
func ParseHostAuthority(s string) (host string, port uint16, err error) {
	bad := func(why string) (string, uint16, error) {
		return "", 0, fmt.Errorf("hbone: %q: %w (%s)", s, ErrBadHostAuthority, why)
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return bad("no port")
	}
	host, ps := s[:i], s[i+1:]
	if len(ps) == 0 || len(ps) > 5 || ps[0] == '0' {
		return bad("port not 1-65535 without leading zeros")
	}
	n := 0
	for j := 0; j < len(ps); j++ {
		if ps[j] < '0' || ps[j] > '9' {
			return bad("port not decimal")
		}
		n = n*10 + int(ps[j]-'0')
	}
	if n > 65535 {
		return bad("port not 1-65535 without leading zeros")
	}
	if len(host) == 0 || len(host) > maxHostnameLen {
		return bad("host empty or longer than 253")
	}
	lower := true
	for label := range strings.SplitSeq(host, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return bad("empty, long or hyphen-edged label")
		}
		for j := 0; j < len(label); j++ {
			c := label[j]
			switch {
			case c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-':
			case c >= 'A' && c <= 'Z':
				lower = false
			default:
				return bad(fmt.Sprintf("character %q", c))
			}
		}
	}
	last := host[strings.LastIndexByte(host, '.')+1:]
	if strings.Trim(last, "0123456789") == "" {
		return bad("all-digit last label (an IP address, not a name)")
	}
	if !lower {
		host = strings.ToLower(host)
	}
	return host, uint16(n), nil
}

// FormatAuthority renders ap as a CONNECT :authority ("10.0.0.1:80",
// "[fd00::1]:80").
func FormatAuthority(ap netip.AddrPort) string { return ap.String() }

// Baggage is the telemetry context HBONE clients send in the "baggage"
// header (W3C baggage with Istio's keys). Empty fields are omitted.
type Baggage struct {
	ClusterName    string // k8s.cluster.name
	Namespace      string // k8s.namespace.name
	WorkloadType   string // the <type> in k8s.<type>.name: deployment, cronjob, pod, job
	WorkloadName   string // k8s.<type>.name
	ServiceName    string // service.name (canonical service)
	ServiceVersion string // service.version (canonical revision)
	Region         string // cloud.region
	Zone           string // cloud.availability_zone
}

// maxBaggageLen bounds what ParseBaggage reads (W3C's limit is 8192 bytes).
const maxBaggageLen = 8192

// String renders b as a baggage header value. Members that would take it
// past the maxBaggageLen bytes ParseBaggage reads are left out (see fit).
func (b Baggage) String() string {
	var sb strings.Builder
	b = b.fit()
	b.members(func(k string, v *string) {
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k)
		sb.WriteByte('=')
		writeBaggageValue(&sb, *v)
	})
	return sb.String()
}

// members calls fn for each member String renders, in render order, with a
// pointer to its value so fit can clear it.
func (b *Baggage) members(fn func(k string, v *string)) {
	add := func(k string, v *string) {
		if *v != "" {
			fn(k, v)
		}
	}
	add("k8s.cluster.name", &b.ClusterName)
	add("k8s.namespace.name", &b.Namespace)
	if b.WorkloadType != "" && validBaggageKeyPart(b.WorkloadType) {
		add("k8s."+b.WorkloadType+".name", &b.WorkloadName)
	}
	add("service.name", &b.ServiceName)
	add("service.version", &b.ServiceVersion)
	add("cloud.region", &b.Region)
	add("cloud.availability_zone", &b.Zone)
}

// fit drops, in render order, each member whose escaped form would take the
// rendering past maxBaggageLen. A member is dropped whole because a cut value
// would name another workload. String and ParseBaggage both apply it, so
// whatever ParseBaggage returns renders in full and parses back the same.
func (b Baggage) fit() Baggage {
	n := 0
	b.members(func(k string, v *string) {
		l := len(k) + 1 + escapedBaggageLen(*v)
		if n > 0 {
			l++ // the comma
		}
		if n+l > maxBaggageLen {
			*v = ""
			return
		}
		n += l
	})
	if b.WorkloadName == "" {
		b.WorkloadType = ""
	}
	return b
}

// ParseBaggage reads the keys Istio uses from a baggage header value. It is
// lenient the way telemetry must be: unknown keys, properties (";...") and
// malformed members are skipped, and values are percent-decoded. Input
// beyond 8 KiB is ignored, including the member it cuts, and members that
// String could not render within 8 KiB are dropped (see fit).
func ParseBaggage(s string) Baggage {
	if len(s) > maxBaggageLen {
		s = s[:maxBaggageLen]
		if i := strings.LastIndexByte(s, ','); i >= 0 {
			s = s[:i]
		} else {
			s = ""
		}
	}
	var b Baggage
	for len(s) > 0 {
		var member string
		member, s, _ = strings.Cut(s, ",")
		member, _, _ = strings.Cut(member, ";")
		k, v, ok := strings.Cut(member, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), unescapeBaggageValue(strings.TrimSpace(v))
		if v == "" {
			continue // empty means absent, as String omits empty fields
		}
		switch k {
		case "k8s.cluster.name":
			b.ClusterName = v
		case "k8s.namespace.name":
			b.Namespace = v
		case "service.name":
			b.ServiceName = v
		case "service.version":
			b.ServiceVersion = v
		case "cloud.region":
			b.Region = v
		case "cloud.availability_zone":
			b.Zone = v
		default:
			if typ, ok := strings.CutPrefix(k, "k8s."); ok {
				if typ, ok = strings.CutSuffix(typ, ".name"); ok && validBaggageKeyPart(typ) {
					b.WorkloadType, b.WorkloadName = typ, v
				}
			}
		}
	}
	return b.fit()
}

func validBaggageKeyPart(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// baggageOctet reports whether c may appear unescaped in a W3C baggage value.
func baggageOctet(c byte) bool {
	return c == 0x21 || c >= 0x23 && c <= 0x2B || c >= 0x2D && c <= 0x3A ||
		c >= 0x3C && c <= 0x5B || c >= 0x5D && c <= 0x7E
}

// escapedBaggageLen is the length writeBaggageValue gives v.
func escapedBaggageLen(v string) int {
	n := len(v)
	for i := 0; i < len(v); i++ {
		if c := v[i]; !baggageOctet(c) || c == '%' {
			n += 2
		}
	}
	return n
}

func writeBaggageValue(sb *strings.Builder, v string) {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if baggageOctet(c) && c != '%' {
			sb.WriteByte(c)
			continue
		}
		sb.WriteByte('%')
		sb.WriteByte(hexDigits[c>>4])
		sb.WriteByte(hexDigits[c&15])
	}
}

func unescapeBaggageValue(v string) string {
	if !strings.Contains(v, "%") {
		return v
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] == '%' && i+2 < len(v) {
			hi, ok1 := unhex(v[i+1])
			lo, ok2 := unhex(v[i+2])
			if ok1 && ok2 {
				out = append(out, hi<<4|lo)
				i += 2
				continue
			}
		}
		out = append(out, v[i])
	}
	return string(out)
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// BuildForwarded renders the "forwarded" header HBONE clients send:
// for="<client ip:port>" and, when the destination service is known,
// ;host=<service hostname>.
func BuildForwarded(client netip.AddrPort, host string) string {
	s := `for="` + client.String() + `"`
	if host != "" {
		s += ";host=" + forwardedValue(host)
	}
	return s
}

func forwardedValue(v string) string {
	for i := 0; i < len(v); i++ {
		if !tokenChar(v[i]) {
			return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v) + `"`
		}
	}
	return v
}

// ForwardedHost returns the host= parameter of the first forwarded-element
// in a "forwarded" header, with quotes stripped, as the receiving ztunnel
// uses it to attribute metrics to a service. It returns "" when there is
// none or when the value is not printable ASCII.
func ForwardedHost(s string) string {
	if len(s) > maxBaggageLen {
		return ""
	}
	elem, _, _ := strings.Cut(s, ",")
	for _, pair := range strings.Split(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(k, "host") {
			continue
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = strings.ReplaceAll(v[1:len(v)-1], `\`, "")
		}
		for i := 0; i < len(v); i++ {
			if v[i] <= 0x20 || v[i] >= 0x7f {
				return ""
			}
		}
		return v
	}
	return ""
}

func tokenChar(c byte) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// TraceparentLen is the length of a version-00 W3C traceparent.
const TraceparentLen = 55

// NewTraceparent returns a random W3C traceparent
// "00-<32 hex trace id>-<16 hex parent id>-00", as ztunnel sends one per
// connection.
func NewTraceparent() string {
	var b [TraceparentLen]byte
	b[0], b[1], b[2] = '0', '0', '-'
	putHex64(b[3:19], nonZero64())
	putHex64(b[19:35], rand.Uint64())
	b[35] = '-'
	putHex64(b[36:52], nonZero64())
	b[52], b[53], b[54] = '-', '0', '0'
	return string(b[:])
}

func nonZero64() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

func putHex64(dst []byte, v uint64) {
	const hexDigits = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		dst[i] = hexDigits[v&15]
		v >>= 4
	}
}

// ValidTraceparent reports whether s is a well-formed W3C traceparent of
// exactly 55 characters: lowercase hex fields, a version other than ff, and
// non-zero trace and parent ids.
func ValidTraceparent(s string) bool {
	if len(s) != TraceparentLen || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	for _, f := range [...]string{s[0:2], s[3:35], s[36:52], s[53:55]} {
		for i := 0; i < len(f); i++ {
			if c := f[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return s[0:2] != "ff" && strings.Trim(s[3:35], "0") != "" && strings.Trim(s[36:52], "0") != ""
}

// TraceparentOrNew returns s when it is a valid traceparent and a new random
// one otherwise, as the receiving ztunnel does for log correlation.
func TraceparentOrNew(s string) string {
	if ValidTraceparent(s) {
		return s
	}
	return NewTraceparent()
}
