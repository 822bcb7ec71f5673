package caserver

import (
	"strings"
	"testing"
)

// FuzzParseNodeTokens: never panics; what it accepts has non-empty,
// whitespace-free names and tokens.
func FuzzParseNodeTokens(f *testing.F) {
	for _, s := range []string{"node0 abc\n", "# c\n\nn t\nm u", "n", "a b c", "n t\nn u", "\xff \x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseNodeTokens([]byte(s))
		if err != nil {
			return
		}
		for n, tok := range m {
			if n == "" || tok == "" || strings.ContainsAny(n+tok, " \t\n") {
				t.Fatalf("accepted bad entry %q → %q", n, tok)
			}
		}
	})
}
