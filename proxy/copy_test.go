package proxy

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// pipePair returns a connected TCP pair on loopback.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); ch <- c }()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-ch
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// onlyConn hides *net.TCPConn so the buffered path is exercised.
type onlyConn struct{ net.Conn }

func (c onlyConn) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }

func TestBidirectionalHalfCloseAndCounts(t *testing.T) {
	for _, name := range []string{"splice", "buffered"} {
		t.Run(name, func(t *testing.T) {
			client, downSrv := tcpPair(t) // client ↔ proxy's downstream socket
			upCli, server := tcpPair(t)   // proxy's upstream socket ↔ server
			var down, up net.Conn = downSrv, upCli
			if name == "buffered" {
				down, up = onlyConn{downSrv}, onlyConn{upCli}
			}
			var c Counters
			done := make(chan error, 1)
			go func() { done <- Bidirectional(down, up, &c, nil) }()

			req := make([]byte, 3<<20)
			rand.Read(req)
			go func() { client.Write(req); client.CloseWrite() }()
			got, err := io.ReadAll(server) // EOF only if the half-close passed through
			if err != nil || !bytes.Equal(got, req) {
				t.Fatalf("server got %d bytes (err %v), want %d intact", len(got), err, len(req))
			}
			resp := []byte("response after the client half-closed")
			server.Write(resp)
			server.CloseWrite()
			back, err := io.ReadAll(client)
			if err != nil || !bytes.Equal(back, resp) {
				t.Fatalf("client got %q (err %v)", back, err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Bidirectional did not return after both halves closed")
			}
			if c.Sent.Load() != int64(len(req)) || c.Received.Load() != int64(len(resp)) {
				t.Fatalf("counters sent=%d recv=%d", c.Sent.Load(), c.Received.Load())
			}
		})
	}
}

func TestBidirectionalForce(t *testing.T) {
	_, down := tcpPair(t)
	up, _ := tcpPair(t)
	force := make(chan struct{})
	done := make(chan error, 1)
	var c Counters
	go func() { done <- Bidirectional(down, up, &c, force) }()
	close(force)
	select {
	case err := <-done:
		if err != ErrForced {
			t.Fatalf("err = %v, want ErrForced", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("force did not end the copy")
	}
}

func TestBufferedCopySteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation budgets are checked by the non-race run (make test runs both)")
	}
	src := bytes.NewReader(make([]byte, 1<<20))
	var dst net.Conn = discardConn{}
	var c Counters
	// Warm the pools.
	var rc net.Conn = readerConn{src}
	bufferedCopy(dst, rc, &c.Sent)
	allocs := testing.AllocsPerRun(20, func() {
		src.Seek(0, io.SeekStart)
		bufferedCopy(dst, rc, &c.Sent)
	})
	if allocs > 0 {
		t.Fatalf("bufferedCopy allocates %.1f times per copy; want pooled buffers", allocs)
	}
}

type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error) { return len(b), nil }

type readerConn struct{ r io.Reader }

func (r readerConn) Read(b []byte) (int, error)     { return r.r.Read(b) }
func (readerConn) Write(b []byte) (int, error)      { return len(b), nil }
func (readerConn) Close() error                     { return nil }
func (readerConn) LocalAddr() net.Addr              { return nil }
func (readerConn) RemoteAddr() net.Addr             { return nil }
func (readerConn) SetDeadline(time.Time) error      { return nil }
func (readerConn) SetReadDeadline(time.Time) error  { return nil }
func (readerConn) SetWriteDeadline(time.Time) error { return nil }
