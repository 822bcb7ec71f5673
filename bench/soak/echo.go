package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// echoReady is the line the echo server logs once it listens.
const echoReady = "soak echo: listening"

// echoBuf is the echo server's buffer per connection. A plain copy loop, not
// io.Copy: between two TCP connections io.Copy splices through a pipe,
// which holds two more descriptors per connection for its whole life.
const echoBuf = 2048

// startEcho runs this program again, as the echo server, inside the server
// pod: a process of its own, so it and this one each hold one descriptor
// per tunnel.
func (s *soak) startEcho() error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("echo server: %w", err)
	}
	p, err := s.server.Start(testcluster.Process{Name: "soak-echo", Path: self,
		Args: []string{"-echo-server", ":" + strconv.Itoa(echoPort)}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.WaitLog(ctx, echoReady); err != nil {
		return fmt.Errorf("echo server: %w", err)
	}
	return nil
}

// serveEcho is the echo server's main: every connection gets back what it
// sends; its end of file is passed on once everything was echoed.
func serveEcho(addr string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak echo:", err)
		return 1
	}
	fmt.Fprintln(os.Stderr, echoReady, "on", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			// EMFILE and the like: say so, back off, keep serving.
			fmt.Fprintln(os.Stderr, "soak echo: accept:", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go echoConn(c.(*net.TCPConn))
	}
}

func echoConn(c *net.TCPConn) {
	defer c.Close()
	buf := make([]byte, echoBuf)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err == io.EOF {
			_ = c.CloseWrite()
			return
		}
		if err != nil {
			return
		}
	}
}
