//go:build !linux

package hbone

// pollReader is Linux-only; elsewhere reads fall back to blocking reads.
type pollReader struct{}

func newPollReader(any) *pollReader { return nil }

func (*pollReader) read(int) (*[]byte, int, error) { panic("unreachable") }

// sinkWriter is Linux-only; elsewhere received bytes go through the drain
// goroutine.
type sinkWriter struct{}

func newSinkWriter(any) *sinkWriter { return nil }

func (*sinkWriter) write([]byte) int { panic("unreachable") }

func (*sinkWriter) writev([][]byte) (int64, error) { panic("unreachable") }

// fdWriter is Linux-only; elsewhere socket writes go through net.Conn.
type fdWriter struct{}

func newFdWriter(any) *fdWriter { return nil }

func (*fdWriter) write([]byte) (int, error) { panic("unreachable") }

// sockWatch is Linux-only; elsewhere SpliceAsync copies on a goroutine.
type sockWatch struct{}

func newSockWatch(*splice) *sockWatch { return nil }

func (*sockWatch) start() { panic("unreachable") }
func (*sockWatch) abort() { panic("unreachable") }

// runEnding is false: there are no splice workers.
func runEnding(*Tunnel) bool { return false }
