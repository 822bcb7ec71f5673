package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// The peer: HAProxy as an explicit (not capturing) proxy on each node, the
// same mTLS hop as our HBONE between the nodes, in TCP mode.
//
//	bench-plain/client → node0 HAProxy (node0's pod gateway, server ports)
//	  → TLS 1.3 with client certificates → node1 HAProxy (node1's underlay
//	  address, server ports) → plain TCP → bench-plain/server
//
// One listener per server port (iperf3, fortio, greeter), so a client
// reaches the peer path by swapping the server's address for node0's
// gateway. Both sides verify the other's chain against our CA's root; both
// certificates are ECDSA P-256 leaves from internal/controlplane/ca, as the
// node proxies' HBONE certificates are. As in HBONE (and bench/hbone's
// HAProxy pair): TLS 1.3 only, AES-128-GCM (the suite Go negotiates on a CPU
// with AES instructions; OpenSSL would pick AES-256 first), no session
// tickets or resumption, so every connection through the peer pays a full
// handshake, as every new HBONE pool connection does. HAProxy 2.6 cannot
// match a URI SAN, so it checks the chain but not the SPIFFE ID (our inbound
// checks both).
type peer struct {
	procs [2]*testcluster.Proc
	// addr is what a client dials instead of the server's address.
	addr netip.Addr
	// node1Addr is where node1's HAProxy accepts TLS.
	node1Addr netip.Addr
	// client is node0's certificate, for checkTLS.
	client *identity.WorkloadCertificate
	roots  *x509.CertPool
}

// peerPorts are the server ports the peer forwards (same number on both
// nodes and at the server).
var peerPorts = []struct {
	name string
	port int
}{{"iperf3", iperfPort}, {"fortio", fortioPort}, {"greeter", greeterPort}}

// peerCiphers is AES-128-GCM, what Go's crypto/tls picks for our HBONE on a
// CPU with AES instructions.
const peerCiphers = "TLS_AES_128_GCM_SHA256"

// startPeer writes certificates and configs into a temp dir and starts one
// HAProxy per node (inside the node's namespace, stopped by the cluster's
// teardown or by our own cleanup; a killed run's HAProxy dies with its
// parent or is swept with the node namespace by the next run).
func (b *bench) startPeer(ctx context.Context) error {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		return fmt.Errorf("the peer needs HAProxy (`make deps`; or -peer=false): %w", err)
	}
	dir := b.prog.TempDir()
	authority, err := ca.New(ca.Options{})
	if err != nil {
		return fmt.Errorf("peer CA: %w", err)
	}
	rootPath := filepath.Join(dir, "root.pem")
	if err := os.WriteFile(rootPath, authority.RootPEM(), 0o644); err != nil {
		return err
	}
	certs := map[string]*identity.WorkloadCertificate{}
	for _, sa := range []string{"client", "server"} {
		wc, err := authority.Issue(identity.MustNew(authority.TrustDomain(), "bench-peer", sa), 24*time.Hour)
		if err != nil {
			return fmt.Errorf("peer certificate %s: %w", sa, err)
		}
		if err := writeCertKey(filepath.Join(dir, sa+".pem"), wc); err != nil {
			return err
		}
		certs[sa] = wc
	}
	n0, n1 := b.m.Nodes[0].Node, b.m.Nodes[1].Node
	p := &peer{addr: n0.Gateway, node1Addr: n1.UnderlayIP, client: certs["client"], roots: x509.NewCertPool()}
	p.roots.AddCert(authority.Root())

	var cfg [2]strings.Builder
	for i := range cfg {
		fmt.Fprintf(&cfg[i], "global\n    maxconn 4096\n")
		fmt.Fprintf(&cfg[i], "    ssl-default-bind-ciphersuites %s\n    ssl-default-bind-options ssl-min-ver TLSv1.3 no-tls-tickets\n", peerCiphers)
		fmt.Fprintf(&cfg[i], "    ssl-default-server-ciphersuites %s\n    ssl-default-server-options ssl-min-ver TLSv1.3 no-tls-tickets\n", peerCiphers)
		fmt.Fprintf(&cfg[i], "defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 5m\n    timeout server 5m\n")
	}
	for _, pp := range peerPorts {
		fmt.Fprintf(&cfg[0], "listen %s\n    bind %s:%d\n    server node1 %s:%d ssl crt %s ca-file %s verify required no-ssl-reuse\n",
			pp.name, p.addr, pp.port, p.node1Addr, pp.port, filepath.Join(dir, "client.pem"), rootPath)
		fmt.Fprintf(&cfg[1], "listen %s\n    bind %s:%d ssl crt %s ca-file %s verify required\n    server app %s:%d\n",
			pp.name, p.node1Addr, pp.port, filepath.Join(dir, "server.pem"), rootPath, b.directServer.IP, pp.port)
	}
	// Server side first, so node0's first connection finds it.
	for _, i := range []int{1, 0} {
		path := filepath.Join(dir, fmt.Sprintf("haproxy-node%d.cfg", i))
		if err := os.WriteFile(path, []byte(cfg[i].String()), 0o644); err != nil {
			return err
		}
		if out, err := runCmd(ctx, haproxy, "-c", "-q", "-f", path); err != nil {
			return fmt.Errorf("haproxy -c %s: %w: %s", path, err, out)
		}
		node := b.m.Nodes[i].Node
		// -db: foreground, one process (its threads: HAProxy's default, one
		// per CPU, as GOMAXPROCS is for our proxies).
		proc, err := node.Start(testcluster.Process{Name: fmt.Sprintf("haproxy-node%d", i), Path: haproxy,
			Args: []string{"-db", "-f", path}, StopTimeout: 3 * time.Second})
		if err != nil {
			return err
		}
		p.procs[i] = proc
		b.prog.Cleanup(func() {
			if err := proc.Stop(); err != nil {
				logf("stopping haproxy on node%d: %v", i, err)
			}
		})
		for _, pp := range peerPorts {
			if err := waitListen(ctx, node.NetNS, "node"+fmt.Sprint(i), pp.port, proc.Done()); err != nil {
				return fmt.Errorf("haproxy on node%d: %w (log: %s)", i, err, proc.Log())
			}
		}
	}
	b.peer = p
	return b.checkPeerTLS(ctx)
}

// writeCertKey writes wc's chain and private key into one PEM file (what
// HAProxy's crt takes).
func writeCertKey(path string, wc *identity.WorkloadCertificate) error {
	b, err := benchkit.CertKeyPEM(wc)
	if err != nil {
		return fmt.Errorf("peer key: %w", err)
	}
	return os.WriteFile(path, b, 0o600)
}

// checkPeerTLS proves node1's HAProxy is the mTLS hop it should be: from
// node0, a TLS 1.3 client with node0's certificate gets the greeter's byte,
// and one without a certificate does not.
func (b *bench) checkPeerTLS(ctx context.Context) error {
	p := b.peer
	dst := fmt.Sprintf("%s:%d", p.node1Addr, greeterPort)
	try := func(withCert bool) (tls.ConnectionState, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		raw, err := b.m.Nodes[0].Node.Dial(cctx, "tcp", dst)
		if err != nil {
			return tls.ConnectionState{}, err
		}
		defer raw.Close()
		conf := &tls.Config{
			MinVersion: tls.VersionTLS13,
			// The server's certificate names a SPIFFE ID, not a host: verify
			// the chain here instead of the name.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("no server certificate")
				}
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: p.roots,
					KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
				return err
			},
		}
		if withCert {
			conf.Certificates = []tls.Certificate{p.client.TLS}
		}
		c := tls.Client(raw, conf)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		var one [1]byte
		if _, err := io.ReadFull(c, one[:]); err != nil {
			return c.ConnectionState(), err
		}
		if one[0] != '!' {
			return c.ConnectionState(), fmt.Errorf("greeting %q, want '!'", one[0])
		}
		return c.ConnectionState(), nil
	}
	cs, err := try(true)
	if err != nil {
		return fmt.Errorf("peer: TLS with a client certificate to node1's HAProxy %s: %w", dst, err)
	}
	if cs.Version != tls.VersionTLS13 {
		return fmt.Errorf("peer: node1's HAProxy negotiated %s, want TLS 1.3", tls.VersionName(cs.Version))
	}
	if _, err := try(false); err == nil {
		return fmt.Errorf("peer: node1's HAProxy %s served a client without a certificate", dst)
	}
	logf("peer: HAProxy pids %d (node0), %d (node1); node1 requires a client certificate; %s, %s",
		p.procs[0].PID(), p.procs[1].PID(), tls.VersionName(cs.Version), tls.CipherSuiteName(cs.CipherSuite))
	return nil
}

// peerPIDs are the two HAProxy processes, by node.
func (b *bench) peerPIDs() [2]int { return [2]int{b.peer.procs[0].PID(), b.peer.procs[1].PID()} }

// peerMemory returns the larger VmRSS of the two HAProxy processes in MiB
// (as proxyMemory does for the node proxies).
func (b *bench) peerMemory() (float64, error) {
	var max float64
	for i, pid := range b.peerPIDs() {
		st, err := benchkit.Status(pid)
		if err != nil {
			return 0, fmt.Errorf("node%d haproxy memory: %w", i, err)
		}
		rss := float64(st["VmRSS"]) / 1024
		max = maxf(max, rss)
		logf("node%d haproxy: VmRSS %.1f MiB (anon %.1f, file %.1f), VmHWM %.1f MiB, threads %d",
			i, rss, float64(st["RssAnon"])/1024, float64(st["RssFile"])/1024, float64(st["VmHWM"])/1024, st["Threads"])
	}
	return max, nil
}

func maxf(a, b float64) float64 {
	if a > b {
		return a
	}
	return b
}

// waitListen polls `ss` inside ns until a TCP socket listens on port, or
// done (the listener's process exit; nil if none) is closed.
func waitListen(ctx context.Context, ns *testcluster.NetNS, what string, port int, done <-chan struct{}) error {
	for {
		out, err := ns.Exec(ctx, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port))
		if err == nil && strings.TrimSpace(string(out)) != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing listens on port %d in %s: %w", port, what, ctx.Err())
		case <-done:
			return fmt.Errorf("exited before listening on port %d in %s", port, what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
