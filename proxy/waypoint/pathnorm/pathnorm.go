// Package pathnorm normalizes HTTP request paths as Istio's mesh option
// pathNormalization (istio.io/api mesh/v1alpha1 ProxyPathNormalization)
// makes Envoy do: the normalized path is what authorization matches, what
// routing matches and what the backend receives. A path a policy sees in one
// form and a backend in another is how a DENY on /admin* is bypassed
// (CVE-2021-31920), so the waypoint normalizes once, before either.
//
// The steps, in Envoy's order (Istio's "Authorization Policy Normalization"
// reference page):
//
//  1. Percent-decode once (no double decoding) the unreserved characters
//     Istio lists: %2D, %2E, %30-%39, %41-%5A, %5F, %61-%7A, %7E, hex in
//     either case; with DecodeAndMergeSlashes also %2F and %5C.
//  2. Backslashes become forward slashes.
//  3. Dot segments are removed as RFC 3986 section 5.2.4 says ("/a/../b" is
//     "/b"; ".." at the root stays at the root).
//  4. With MergeSlashes and DecodeAndMergeSlashes, runs of "/" become one.
//
// None leaves the path as the client sent it. In every mode the fragment is
// dropped and a %00 is refused (Istio: "always rejected with HTTP code 400").
package pathnorm

import (
	"errors"
	"strings"
)

// Mode is a pathNormalization option; the values are the proto's
// (mesh/v1alpha1 MeshConfig.ProxyPathNormalization.NormalizationType), so a
// wire value converts with Mode(v).
type Mode int32

const (
	// Default is Base, as Istio documents.
	Default Mode = 0
	// None: paths are used as received.
	None Mode = 1
	// Base: RFC 3986 normalization plus backslash to slash (Envoy's
	// normalize_path).
	Base Mode = 2
	// MergeSlashes: Base, then consecutive slashes merged.
	MergeSlashes Mode = 3
	// DecodeAndMergeSlashes: %2F and %5C decoded first, then MergeSlashes.
	DecodeAndMergeSlashes Mode = 4
)

var modeNames = map[Mode]string{Default: "DEFAULT", None: "NONE", Base: "BASE", MergeSlashes: "MERGE_SLASHES", DecodeAndMergeSlashes: "DECODE_AND_MERGE_SLASHES"}

func (m Mode) String() string {
	if s, ok := modeNames[m]; ok {
		return s
	}
	return "UNKNOWN"
}

// ParseMode reads Istio's spelling of an option ("" is Default).
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return Default, nil
	}
	for m, n := range modeNames {
		if n == s {
			return m, nil
		}
	}
	return Default, errors.New("pathnorm: unknown pathNormalization " + `"` + s + `"` + " (NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES)")
}

// Errors are answered 400 by the caller: the path cannot be normalized, so
// no policy can be trusted to have seen what the backend would see.
var (
	// ErrNul: the path holds %00.
	ErrNul = errors.New("pathnorm: %00 in the path")
	// ErrNotAbsolute: the path does not start with "/".
	ErrNotAbsolute = errors.New("pathnorm: the path does not start with /")
)

// Target normalizes an origin-form request target ("/path?query#frag"): it
// returns the target to forward (normalized path, the query unchanged, no
// fragment) and the path alone, which authorization and routing match (Istio
// matches paths without the query).
func Target(mode Mode, target string) (forward, path string, err error) {
	if i := strings.IndexByte(target, '#'); i >= 0 {
		target = target[:i]
	}
	path, query, hasQuery := strings.Cut(target, "?")
	path, err = Path(mode, path)
	if err != nil {
		return "", "", err
	}
	if hasQuery {
		return path + "?" + query, path, nil
	}
	return path, path, nil
}

// Path normalizes a path without query or fragment.
func Path(mode Mode, p string) (string, error) {
	if strings.Contains(p, "%00") {
		return "", ErrNul
	}
	if !strings.HasPrefix(p, "/") {
		return "", ErrNotAbsolute
	}
	if mode == None {
		return p, nil
	}
	p = decode(p, mode == DecodeAndMergeSlashes)
	p = strings.ReplaceAll(p, `\`, "/")
	p = removeDots(p)
	if mode == MergeSlashes || mode == DecodeAndMergeSlashes {
		p = mergeSlashes(p)
	}
	return p, nil
}

// decode percent-decodes, in one pass, the characters Istio decodes; others
// (and malformed escapes) are left exactly as written, hex case included.
func decode(p string, slashes bool) string {
	if !strings.Contains(p, "%") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) {
			hi, ok1 := unhex(p[i+1])
			lo, ok2 := unhex(p[i+2])
			if ok1 && ok2 {
				if c := hi<<4 | lo; decodable(c, slashes) {
					b.WriteByte(c)
					i += 2
					continue
				}
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

func decodable(c byte, slashes bool) bool {
	switch {
	case c >= '0' && c <= '9', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c == '-', c == '.', c == '_', c == '~':
		return true
	case c == '/', c == '\\':
		return slashes
	}
	return false
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

// removeDots applies RFC 3986 remove_dot_segments to an absolute path.
// Empty segments ("//") are kept (merging is a separate option), so ".."
// after "//" removes the empty segment, as Envoy does ("/a//../b" is
// "/a/b"). A segment ".." or "." followed by ";parameters" is a dot segment
// too: servers that strip path parameters (Tomcat's "/..;/") treat it as one,
// and Istio's normalization tests expect "/..;/admin" to become "/admin".
func removeDots(p string) string {
	if !hasDotSegment(p[1:]) {
		return p // most paths: split and joined again it is the same string
	}
	segs := strings.Split(p[1:], "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch dotKind(s) {
		case 1:
			if last {
				out = append(out, "")
			}
		case 2:
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}

// hasDotSegment reports whether a segment of p (split at "/") is a dot
// segment (dotKind).
func hasDotSegment(p string) bool {
	for {
		seg, rest, more := strings.Cut(p, "/")
		if dotKind(seg) != 0 {
			return true
		}
		if !more {
			return false
		}
		p = rest
	}
}

// dotKind: 1 for ".", 2 for "..", 0 for any other segment.
func dotKind(s string) int {
	if i := strings.IndexByte(s, ';'); i >= 0 {
		s = s[:i]
	}
	switch s {
	case ".":
		return 1
	case "..":
		return 2
	}
	return 0
}

func mergeSlashes(p string) string {
	if !strings.Contains(p, "//") {
		return p
	}
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '/' && i > 0 && p[i-1] == '/' {
			continue
		}
		b.WriteByte(p[i])
	}
	return b.String()
}
