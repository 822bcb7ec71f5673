//go:build !linux

package hbone

// pollReader is Linux-only; elsewhere reads fall back to blocking reads.
type pollReader struct{}

func newPollReader(any) *pollReader { return nil }

func (*pollReader) read(int) (*[]byte, int, error) { panic("unreachable") }
