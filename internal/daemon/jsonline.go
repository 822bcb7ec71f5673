package daemon

import (
	"io"
	"net/netip"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// JSONLines writes info lines byte for byte as a NewLogger JSON logger
// named Name would, without zap's per-field work: for a logger that writes
// one line per request. The waypoint's access log through zap cost 10 % of
// its CPU at 1k requests per second (bench/waypoint, log level warn against
// info); most of it was zap dispatching each field through an interface
// and cloning its encoder per line. Lines are written only while Level
// enables info, as the zap logger's would be.
type JSONLines struct {
	// Name is the logger's name ("logger" in each line); "" for none.
	Name  string
	Level zap.AtomicLevel
	// Out receives each line in one Write; it must be safe for
	// concurrent use (a zapcore.BufferedWriteSyncer is).
	Out io.Writer
	// Now is the clock; nil: time.Now.
	Now func() time.Time
}

// Enabled reports whether an info line would be written now.
func (j *JSONLines) Enabled() bool { return j.Level.Enabled(zapcore.InfoLevel) }

var jsonLinePool = sync.Pool{New: func() any { return &JSONLine{b: make([]byte, 0, 1024)} }}

// Info starts an info line with message msg; the caller adds fields and
// calls Write, which ends it. Call only when Enabled.
func (j *JSONLines) Info(msg string) *JSONLine {
	l := jsonLinePool.Get().(*JSONLine)
	l.out = j.Out
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	b := append(l.b[:0], `{"level":"info","time":"`...)
	b = appendISO8601(b, now())
	b = append(b, '"')
	if j.Name != "" {
		b = append(b, `,"logger":`...)
		b = appendJSONString(b, j.Name)
	}
	b = append(b, `,"msg":`...)
	l.b = appendJSONString(b, msg)
	return l
}

// JSONLine is one line being built; its methods add fields in zap's JSON
// encoding (zap.String, zap.Int64, zap.Bool, zap.Duration with NewLogger's
// seconds, zap.Strings).
type JSONLine struct {
	b   []byte
	out io.Writer
}

func (l *JSONLine) key(k string) {
	l.b = append(l.b, ',')
	l.b = appendJSONString(l.b, k)
	l.b = append(l.b, ':')
}

// String adds a string field.
func (l *JSONLine) String(k, v string) *JSONLine {
	l.key(k)
	l.b = appendJSONString(l.b, v)
	return l
}

// Int adds an integer field.
func (l *JSONLine) Int(k string, v int64) *JSONLine {
	l.key(k)
	l.b = strconv.AppendInt(l.b, v, 10)
	return l
}

// Bool adds a boolean field.
func (l *JSONLine) Bool(k string, v bool) *JSONLine {
	l.key(k)
	l.b = strconv.AppendBool(l.b, v)
	return l
}

// Duration adds a duration in seconds, as NewLogger's encoder writes one.
func (l *JSONLine) Duration(k string, d time.Duration) *JSONLine {
	l.key(k)
	l.b = appendSeconds(l.b, d)
	return l
}

// appendSeconds appends d in seconds as strconv.AppendFloat(seconds, 'f',
// -1, 64) does, without the shortest-float search (1.3 µs of each access
// line at 1k req/s in bench/waypoint). Below 10^15 ns the exact decimal,
// trailing zeros trimmed, has at most 15 significant digits, and no two
// such decimals read back as the same float64: so it is the shortest that
// reads back as float64(d)/1e9, which is what AppendFloat writes.
func appendSeconds(b []byte, d time.Duration) []byte {
	if d <= -1e15 || d >= 1e15 {
		return strconv.AppendFloat(b, float64(d)/float64(time.Second), 'f', -1, 64)
	}
	if d < 0 {
		b = append(b, '-')
		d = -d
	}
	b = strconv.AppendInt(b, int64(d/time.Second), 10)
	ns := int64(d % time.Second)
	if ns == 0 {
		return b
	}
	var frac [9]byte
	for i := len(frac) - 1; i >= 0; i-- {
		frac[i] = byte('0' + ns%10)
		ns /= 10
	}
	n := len(frac)
	for frac[n-1] == '0' {
		n--
	}
	b = append(b, '.')
	return append(b, frac[:n]...)
}

// AddrPort adds a as the string field a.String() would, without making
// that string (two per access line).
func (l *JSONLine) AddrPort(k string, a netip.AddrPort) *JSONLine {
	if !a.IsValid() || a.Addr().Zone() != "" {
		return l.String(k, a.String()) // words, or a zone that may need escaping
	}
	l.key(k)
	l.b = append(l.b, '"')
	l.b = a.AppendTo(l.b)
	l.b = append(l.b, '"')
	return l
}

// AddrPortAfter adds the string field prefix+" "+a.String() without
// making that string (the waypoint's "upstream": "hbone 10.0.0.2:8080").
func (l *JSONLine) AddrPortAfter(k, prefix string, a netip.AddrPort) *JSONLine {
	if !a.IsValid() || a.Addr().Zone() != "" {
		return l.String(k, prefix+" "+a.String())
	}
	l.key(k)
	l.b = appendJSONString(l.b, prefix)
	l.b[len(l.b)-1] = ' ' // the prefix's closing quote
	l.b = a.AppendTo(l.b)
	l.b = append(l.b, '"')
	return l
}

// Strings adds an array of strings.
func (l *JSONLine) Strings(k string, v []string) *JSONLine {
	l.key(k)
	l.b = append(l.b, '[')
	for i, s := range v {
		if i > 0 {
			l.b = append(l.b, ',')
		}
		l.b = appendJSONString(l.b, s)
	}
	l.b = append(l.b, ']')
	return l
}

// Write ends the line and writes it; l must not be used after. A write
// error is dropped, as zap drops it for a logger without an error output.
func (l *JSONLine) Write() {
	l.b = append(l.b, "}\n"...)
	_, _ = l.out.Write(l.b)
	l.out = nil
	if cap(l.b) <= 16<<10 { // a huge line's buffer is not kept
		jsonLinePool.Put(l)
	}
}

// appendJSONString appends s quoted and escaped as zap's JSON encoder
// escapes a string: ", \ and control bytes escaped (\n, \r, \t by name),
// invalid UTF-8 replaced by \ufffd, everything else as it is.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	last := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r != utf8.RuneError || size != 1 {
				i += size
				continue
			}
			b = append(b, s[last:i]...)
			b = append(b, `\ufffd`...)
			i++
			last = i
			continue
		}
		if c >= 0x20 && c != '\\' && c != '"' {
			i++
			continue
		}
		b = append(b, s[last:i]...)
		switch c {
		case '\\', '"':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		i++
		last = i
	}
	b = append(b, s[last:]...)
	return append(b, '"')
}
