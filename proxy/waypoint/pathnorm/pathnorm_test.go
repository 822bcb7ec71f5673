package pathnorm

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// The inputs and expected outputs of istio.io/istio
// tests/integration/security/normalization_test.go (TestNormalization),
// rewritten as a table: what the backend receives for each request path
// under each option. "400" is a refused request.
var istioCases = []struct {
	mode Mode
	in   []string // pairs: input, want
}{
	{None, []string{
		"/", "/",
		"/app#foo", "/app",
		"/app/", "/app/",
		"/app/../admin", "/app/../admin",
		"/app", "/app",
		"/app//", "/app//",
		"/app/%2f", "/app/%2f",
		"/app%2f/", "/app%2f/",
		"/xyz%30..//abc", "/xyz%30..//abc",
		"/app/%2E./admin", "/app/%2E./admin",
		`/app\admin`, `/app\admin`,
		`/app/\/\/\admin`, `/app/\/\/\admin`,
		`/%2Fapp%5cadmin%5Cabc`, `/%2Fapp%5cadmin%5Cabc`,
		`/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc`, `/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc`,
		`/app//../admin`, `/app//../admin`,
		`/app//../../admin`, `/app//../../admin`,
	}},
	{Base, []string{
		"/", "/",
		"/app#foo", "/app",
		"/app/", "/app/",
		"/app/../admin", "/admin",
		"/app", "/app",
		"/app//", "/app//",
		"/app/%2f", "/app/%2f",
		"/app%2f/", "/app%2f/",
		"/xyz%30..//abc", "/xyz0..//abc",
		"/app/%2E./admin", "/admin",
		`/app\admin`, `/app/admin`,
		`/app/\/\/\admin`, `/app//////admin`,
		`/%2Fapp%5cadmin%5Cabc`, `/%2Fapp%5cadmin%5Cabc`,
		`/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc`, `/%5Capp%2f%5c%2F..%2fadmin%5c/abc`,
		`/app//../admin`, `/app/admin`,
		`/app//../../admin`, `/admin`,
	}},
	{MergeSlashes, []string{
		"/", "/",
		"/app#foo", "/app",
		"/app/", "/app/",
		"/app/../admin", "/admin",
		"/app", "/app",
		"/app//", "/app/",
		"/app/%2f", "/app/%2f",
		"/app%2f/", "/app%2f/",
		"/xyz%30..//abc", "/xyz0../abc",
		"/app/%2E./admin", "/admin",
		`/app\admin`, `/app/admin`,
		`/app/\/\/\admin`, `/app/admin`,
		`/%2Fapp%5cadmin%5Cabc`, `/%2Fapp%5cadmin%5Cabc`,
		`/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc`, `/%5Capp%2f%5c%2F..%2fadmin%5c/abc`,
		`/app//../admin`, `/app/admin`,
		`/app//../../admin`, `/admin`,
	}},
	{DecodeAndMergeSlashes, []string{
		"/", "/",
		"/app#foo", "/app",
		"/app/", "/app/",
		"/app/../admin", "/admin",
		"/app", "/app",
		"/app//", "/app/",
		"/app/%2f", "/app/",
		"/app%2f/", "/app/",
		"/xyz%30..//abc", "/xyz0../abc",
		"/app/%2E./admin", "/admin",
		`/app\admin`, `/app/admin`,
		`/app/\/\/\admin`, `/app/admin`,
		`/%2Fapp%5cadmin%5Cabc`, `/app/admin/abc`,
		`/%5Capp%2f%5c%2F%2e%2e%2fadmin%5c\abc`, `/app/admin/abc`,
		`/app//../admin`, `/app/admin`,
		`/app//../../admin`, `/admin`,
		`/%c0%2e%c0%2e/admin`, `/%c0.%c0./admin`,
		`/%c0%2fadmin`, `/%c0/admin`,
		// Istio's "NotNormalized" group.
		`/0x2e0x2e/admin`, `/0x2e0x2e/admin`,
		`/0x2e0x2e0x2fadmin`, `/0x2e0x2e0x2fadmin`,
		`/0x2e0x2e0x5cadmin`, `/0x2e0x2e0x5cadmin`,
		`/0x2f0x2fadmin`, `/0x2f0x2fadmin`,
		`/0x5c0x5cadmin`, `/0x5c0x5cadmin`,
		`/%25c0%25ae%25c1%259cadmin`, `/%25c0%25ae%25c1%259cadmin`,
		`/%25c0%25ae%25c0%25ae/admin`, `/%25c0%25ae%25c0%25ae/admin`,
		`/%25c0%25afadmin`, `/%25c0%25afadmin`,
		`/%25c1%259cadmin`, `/%25c1%259cadmin`,
		`/%252e%252e/admin`, `/%252e%252e/admin`,
		`/%252e%252e%252fadmin`, `/%252e%252e%252fadmin`,
		`/%c1%9cadmin`, `/%c1%9cadmin`,
		`/%c0%ae%c0%ae/admin`, `/%c0%ae%c0%ae/admin`,
		`/%c0%afadmin`, `/%c0%afadmin`,
		`/.../admin`, `/.../admin`,
		`/..../admin`, `/..../admin`,
		`/..;/admin`, `/admin`,
		`/;/admin`, `/;/admin`,
		`/admin;a=b`, `/admin;a=b`,
		`/admin;a=b/xyz`, `/admin;a=b/xyz`,
		`/admin,a=b/xyz`, `/admin,a=b/xyz`,
		`/Admin`, `/Admin`,
		`/ADMIN`, `/ADMIN`,
		// Istio's "Invalid" group.
		`/admin%00`, "400",
	}},
}

func TestIstioNormalizationTable(t *testing.T) {
	for _, tc := range istioCases {
		for i := 0; i < len(tc.in); i += 2 {
			in, want := tc.in[i], tc.in[i+1]
			t.Run(tc.mode.String()+" "+in, func(t *testing.T) {
				fwd, _, err := Target(tc.mode, in)
				if want == "400" {
					if !errors.Is(err, ErrNul) {
						t.Fatalf("Target(%s, %q) = %q, %v; want ErrNul", tc.mode, in, fwd, err)
					}
					return
				}
				if err != nil || fwd != want {
					t.Fatalf("Target(%s, %q) = %q, %v; want %q", tc.mode, in, fwd, err, want)
				}
			})
		}
	}
}

// TestPercentEncoded is Istio's "PercentEncoded" group: every %01..%FF after
// /admin under DECODE_AND_MERGE_SLASHES; the characters Istio lists are
// decoded (a backslash then becomes a slash), all others are kept as sent.
func TestPercentEncoded(t *testing.T) {
	for i := 1; i <= 0xff; i++ {
		in := fmt.Sprintf("/admin%%%.2x", i)
		want := in
		c := byte(i)
		if c == '-' || c == '.' || c == '/' || c == '\\' || c == '_' || c == '~' ||
			c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' {
			want, _ = url.PathUnescape(in)
			want = strings.ReplaceAll(want, `\`, "/")
		}
		// "/admin." ends in a dot inside the segment: not a dot segment.
		got, err := Path(DecodeAndMergeSlashes, in)
		if err != nil || got != want {
			t.Errorf("Path(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestBypasses are the attacks a DENY on /admin* must see through: each
// normalizes to a path under /admin in BASE and the stronger options, and
// stays as sent under NONE (Istio: "paths are used as is").
func TestBypasses(t *testing.T) {
	for _, in := range []string{"/public/../admin/x", "/public/%2e%2e/admin/x", "/./admin/x", "/public/%2E%2E/admin/x",
		`/public\..\admin\x`, "/public/..;/admin/x", "/%61dmin/x", "/public/%2e./admin/x"} {
		for _, m := range []Mode{Default, Base, MergeSlashes, DecodeAndMergeSlashes} {
			got, err := Path(m, in)
			if err != nil || got != "/admin/x" {
				t.Errorf("Path(%s, %q) = %q, %v; want /admin/x", m, in, got, err)
			}
		}
		if got, _ := Path(None, in); got != in {
			t.Errorf("Path(NONE, %q) = %q; want it unchanged", in, got)
		}
	}
	// Slashes: merged only by the two stronger options; encoded slashes
	// decoded only by the strongest.
	for _, c := range []struct {
		mode    Mode
		in, out string
	}{
		{Base, "//admin/x", "//admin/x"},
		{MergeSlashes, "//admin/x", "/admin/x"},
		{MergeSlashes, "/%2fadmin/x", "/%2fadmin/x"},
		{DecodeAndMergeSlashes, "/%2fadmin/x", "/admin/x"},
		{DecodeAndMergeSlashes, "/%5Cadmin%5cx", "/admin/x"},
	} {
		if got, err := Path(c.mode, c.in); err != nil || got != c.out {
			t.Errorf("Path(%s, %q) = %q, %v; want %q", c.mode, c.in, got, err, c.out)
		}
	}
}

func TestTargetKeepsQuery(t *testing.T) {
	fwd, path, err := Target(Base, "/a/../b/%2e?x=/../y&z=%2e#frag")
	if err != nil || fwd != "/b/?x=/../y&z=%2e" || path != "/b/" {
		t.Fatalf("Target = %q, %q, %v", fwd, path, err)
	}
}

func TestRefused(t *testing.T) {
	for _, in := range []string{"", "admin", "*", "http://x/admin", "/a%00b", "/%00"} {
		for _, m := range []Mode{None, Base, DecodeAndMergeSlashes} {
			if _, _, err := Target(m, in); err == nil {
				t.Errorf("Target(%s, %q) accepted", m, in)
			}
		}
	}
}

func TestParseMode(t *testing.T) {
	for m, n := range modeNames {
		if got, err := ParseMode(n); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", n, got, err)
		}
	}
	if m, err := ParseMode(""); err != nil || m != Default {
		t.Errorf(`ParseMode("") = %v, %v`, m, err)
	}
	if _, err := ParseMode("base"); err == nil {
		t.Error(`ParseMode("base") accepted a misspelling`)
	}
}
