package testkit

import "testing"

// SkipShort skips t under `go test -short` (`make check`) with the message
// "short: needs <needs>", so the fast loop says what it left out.
// It does nothing outside a test binary, so the demo and bench/ programs,
// whose TB is a Program, can share harnesses that call it.
func SkipShort(t TB, needs string) {
	t.Helper()
	if !testing.Testing() || !testing.Short() {
		return
	}
	if s, ok := t.(interface{ Skip(args ...any) }); ok {
		s.Skip("short: needs " + needs)
	}
}
