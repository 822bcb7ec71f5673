package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
)

// The peer: HAProxy 2.6 (Debian) in HTTP mode on the same path, with the
// same crypto on both sides and the same L7 work. HAProxy cannot terminate
// HBONE (an HTTP/2 CONNECT tunnel whose stream it would then parse as
// HTTP), so its path is the nearest equal one: the client speaks HTTP/1.1
// in TLS 1.3 with its workload certificate (mTLS in, as HBONE's outer TLS
// is), HAProxy terminates it, requires and verifies the client certificate
// against the mesh root, parses the request, applies the equivalents of
// the two AuthorizationPolicies (DENY /admin*, ALLOW only POST under /api/)
// and of the HTTPRoute (match POST /api, set x-route, remove x-drop, add
// X-Forwarded-For), and sends it in TLS 1.3 with the waypoint's certificate
// (mTLS out) to the server's TLS terminator, reusing its server-side
// connections as the waypoint pools its upstream. As in bench/hbone and
// bench/mesh: AES-128-GCM (what Go negotiates on this CPU), no session
// tickets. What HAProxy does not do that the waypoint does: match the
// client's SPIFFE principal (HAProxy 2.6 has no URI SAN fetch; it checks
// the chain only), per-request Istio metrics and an access-log line, and
// workload-API endpoint resolution; that work is on the waypoint's side of
// the comparison.
const haproxyConfig = `global
	maxconn 4096
	ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256
	ssl-default-bind-options ssl-min-ver TLSv1.3 no-tls-tickets
	ssl-default-server-ciphersuites TLS_AES_128_GCM_SHA256
	ssl-default-server-options ssl-min-ver TLSv1.3 no-tls-tickets

defaults
	mode http
	option http-keep-alive
	timeout connect 5s
	timeout client 120s
	timeout server 120s
	timeout http-keep-alive 120s

frontend waypoint
	bind %[1]s ssl crt %[3]s ca-file %[4]s verify required
	http-request deny deny_status 403 if { path_beg /admin }
	http-request deny deny_status 403 unless { method POST } { path_beg /api/ }
	http-request set-header x-route server-api if { method POST } { path_beg /api }
	http-request del-header x-drop if { method POST } { path_beg /api }
	option forwardfor
	use_backend server if { method POST } { path_beg /api }

backend server
	http-reuse always
	server app %[2]s ssl crt %[3]s ca-file %[4]s verify required
`

// writeHAProxyConfig writes the waypoint's certificate (HAProxy's crt for
// both sides), the root and the config for a listener on listen to dir,
// and returns the config's path.
func writeHAProxyConfig(authority *ca.CA, dir, listen string) (string, error) {
	wc, err := authority.Issue(wpID, 24*time.Hour)
	if err != nil {
		return "", err
	}
	pemb, err := benchkit.CertKeyPEM(wc)
	if err != nil {
		return "", err
	}
	crt, caFile, cfg := filepath.Join(dir, "haproxy-crt.pem"), filepath.Join(dir, "haproxy-ca.pem"), filepath.Join(dir, "haproxy.cfg")
	for _, f := range []struct {
		path string
		b    []byte
	}{{crt, pemb}, {caFile, authority.RootPEM()}, {cfg, fmt.Appendf(nil, haproxyConfig, listen, fmt.Sprintf("%s:%d", serverIP, tlsPort), crt, caFile)}} {
		if err := os.WriteFile(f.path, f.b, 0o600); err != nil {
			return "", err
		}
	}
	return cfg, nil
}

// checkHAProxyConfig runs haproxy -c on cfg.
func checkHAProxyConfig(bin, cfg string) error {
	if out, err := exec.Command(bin, "-c", "-q", "-f", cfg).CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c: %w: %s", err, out)
	}
	return nil
}

// startHAProxy writes the peer's files to dir, checks the config and
// starts HAProxy listening on listen. It returns the process id and how to
// stop it.
func startHAProxy(r *benchkit.Reaper, authority *ca.CA, dir, listen string) (int, func(), error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return 0, nil, fmt.Errorf("the HAProxy peer needs haproxy (make deps installs it): %w", err)
	}
	cfg, err := writeHAProxyConfig(authority, dir, listen)
	if err != nil {
		return 0, nil, err
	}
	if err := checkHAProxyConfig(bin, cfg); err != nil {
		return 0, nil, err
	}
	return benchkit.StartHAProxy(r, bin, cfg, []string{listen})
}
