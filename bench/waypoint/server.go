package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// The server "pod", one child process (-role server): the app on
// serverIP:appPort, and in front of it the two terminators the paths end
// in, standing in for the server's node proxy: HBONE on serverIP:15008
// (what the waypoint sends to) and TLS with a required client certificate
// on serverIP:tlsPort (what HAProxy sends to). Neither is measured; both
// dial the app per tunnel or connection.

// respBody is the app's 1 KiB answer.
var respBody = func() []byte {
	b := make([]byte, msgSize)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}()

// appHandler reads the request body and answers respBody, echoing the
// routing header the proxy set (x-route) and the original client it
// forwarded, so the parent can check the route was applied.
func appHandler(rw http.ResponseWriter, r *http.Request) {
	n, err := io.Copy(io.Discard, r.Body)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	h := rw.Header()
	h.Set("X-Route-Seen", r.Header.Get("x-route"))
	h.Set("X-Body-Bytes", strconv.FormatInt(n, 10))
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.Itoa(len(respBody)))
	_, _ = rw.Write(respBody)
}

func childServer(dir string) error {
	authority, err := benchkit.LoadCA(dir)
	if err != nil {
		return err
	}
	wc, err := authority.Issue(serverID, 24*time.Hour)
	if err != nil {
		return err
	}
	appLn, err := net.Listen("tcp", fmt.Sprintf("%s:%d", serverIP, appPort))
	if err != nil {
		return fmt.Errorf("app: %w (loopback address %s needed)", err, serverIP)
	}
	app := &http.Server{Handler: http.HandlerFunc(appHandler), ReadHeaderTimeout: 10 * time.Second}
	go app.Serve(appLn)
	appAddr := appLn.Addr().String()

	hb, err := hbone.NewServer(hbone.ServerConfig{Identity: serverID, Certs: identity.NewStaticSource(wc),
		Handler: hbone.HandlerFunc(func(ctx context.Context, req *hbone.Request) hbone.Reply {
			if req.Authority.String() != appAddr {
				return hbone.Reply{Status: http.StatusServiceUnavailable}
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", appAddr)
			if err != nil {
				return hbone.Reply{Status: http.StatusServiceUnavailable}
			}
			return hbone.Reply{Status: http.StatusOK, Upstream: c}
		})})
	if err != nil {
		return err
	}
	hbLn, err := net.Listen("tcp", serverIP+":15008")
	if err != nil {
		return fmt.Errorf("hbone terminator: %w", err)
	}
	go hb.Serve(hbLn)

	roots := x509.NewCertPool()
	roots.AddCert(authority.Root())
	tlsLn, err := tls.Listen("tcp", fmt.Sprintf("%s:%d", serverIP, tlsPort), &tls.Config{
		Certificates: []tls.Certificate{wc.TLS}, MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots,
	})
	if err != nil {
		return fmt.Errorf("tls terminator: %w", err)
	}
	go serveTLS(tlsLn, appAddr)

	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the parent goes away
	return nil
}

// serveTLS forwards every accepted TLS connection to the app.
func serveTLS(ln net.Listener, app string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", app)
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				io.Copy(up, c)
				up.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			io.Copy(c, up)
			c.(*tls.Conn).CloseWrite()
			<-done
		}()
	}
}
