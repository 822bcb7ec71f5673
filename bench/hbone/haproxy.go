package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// The HAProxy pair (the peer, issue 17) does the same hop as our chain in
// TCP mode: proxy A accepts plain TCP and connects to proxy B with TLS 1.3
// and a client certificate; proxy B terminates TLS, requires a client
// certificate from the same CA, and forwards plain TCP to the app. The
// certificates are our CA's (ECDSA P-256 leaves, the same chain of leaf and
// root that HBONE sends). As in HBONE: TLS 1.3 only, no session tickets or
// resumption; AES-128-GCM, the suite Go negotiates on this CPU. HAProxy has
// no SPIFFE check (its verifyhost matches DNS names only), so B only checks
// the chain; its key exchange is OpenSSL 3.0's X25519 (Go's default adds
// ML-KEM): both cost only at connection setup.

const haproxyGlobal = `global
	maxconn 4096
%s	ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256
	ssl-default-bind-options ssl-min-ver TLSv1.3 no-tls-tickets
	ssl-default-server-ciphersuites TLS_AES_128_GCM_SHA256
	ssl-default-server-options ssl-min-ver TLSv1.3 no-tls-tickets

defaults
	mode tcp
	timeout connect 5s
	timeout client 120s
	timeout server 120s
`

// haproxyFront is proxy A for one app: plain in, mTLS out.
const haproxyFront = `
frontend %[1]s
	bind %[2]s
	default_backend %[1]s
backend %[1]s
	server b %[3]s ssl crt %[4]s ca-file %[5]s verify required no-ssl-reuse
`

// haproxyBack is proxy B for one app: mTLS in (client certificate
// required), plain out.
const haproxyBack = `
frontend %[1]s
	bind %[2]s ssl crt %[4]s ca-file %[5]s verify required
	default_backend %[1]s
backend %[1]s
	server app %[3]s
`

// startHAProxyChain writes the certificates and both configurations to dir
// and starts the two HAProxy processes in the foreground.
func startHAProxyChain(e *env, dir string, threads int) (*chain, error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return nil, fmt.Errorf("the HAProxy peer needs haproxy (make deps installs it): %w", err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, e.ca.RootPEM(), 0o600); err != nil {
		return nil, err
	}
	clientPEM, serverPEM := filepath.Join(dir, "client.pem"), filepath.Join(dir, "server.pem")
	for _, f := range []struct {
		path string
		id   identity.Identity
	}{{clientPEM, clientID}, {serverPEM, serverID}} {
		wc, err := e.ca.Issue(f.id, time.Hour)
		if err != nil {
			return nil, err
		}
		b, err := benchkit.CertKeyPEM(wc)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(f.path, b, 0o600); err != nil {
			return nil, err
		}
	}
	ports, err := freeAddrs(4)
	if err != nil {
		return nil, err
	}
	frontSink, frontEcho, backSink, backEcho := ports[0], ports[1], ports[2], ports[3]
	nbthread := ""
	if threads > 0 {
		nbthread = fmt.Sprintf("\tnbthread %d\n", threads)
	}
	global := fmt.Sprintf(haproxyGlobal, nbthread)
	backCfg := global +
		fmt.Sprintf(haproxyBack, "sink", backSink, e.sink, serverPEM, caFile) +
		fmt.Sprintf(haproxyBack, "echo", backEcho, e.echo, serverPEM, caFile)
	frontCfg := global +
		fmt.Sprintf(haproxyFront, "sink", frontSink, backSink, clientPEM, caFile) +
		fmt.Sprintf(haproxyFront, "echo", frontEcho, backEcho, clientPEM, caFile)

	c := &chain{name: "haproxy", sink: frontSink, echo: frontEcho}
	var pids [2]int
	for i, p := range []struct {
		name, cfg string
		addrs     []string
	}{{"back", backCfg, []string{backSink, backEcho}}, {"front", frontCfg, []string{frontSink, frontEcho}}} {
		path := filepath.Join(dir, "haproxy-"+p.name+".cfg")
		if err := os.WriteFile(path, []byte(p.cfg), 0o600); err != nil {
			c.stop()
			return nil, err
		}
		pid, stop, err := benchkit.StartHAProxy(reaper, bin, path, p.addrs)
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("haproxy %s: %w", p.name, err)
		}
		c.stops = append(c.stops, stop)
		pids[1-i] = pid // pids is proxy A, proxy B
	}
	c.pids = pids
	return c, nil
}

// freeAddrs returns n distinct free loopback addresses (held open together
// so they differ, then released for HAProxy to bind).
func freeAddrs(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	return out, nil
}
