package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// testCA is a CA of the test's own, apart from the mesh's.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf's certificate and key PEM for cn with DNS SANs dns.
func (ca *testCA) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, dns ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// TestEgressTLSOrigination: a pod in the mesh sends plaintext HTTP to
// external hosts (ServiceEntries bound to the waypoint); DestinationRules
// with tls SIMPLE and MUTUAL make the real cmd/waypoint originate TLS to the
// external server (a TLS-only server outside the mesh, in its own netns,
// with its own CA), with the DestinationRule's SNI, verifying the CA and
// subjectAltNames from a Secret (credentialName) and, for MUTUAL,
// presenting the client certificate from it. A subjectAltNames the server
// does not have fails closed: 503, and nothing reaches the server.
func TestEgressTLSOrigination(t *testing.T) {
	ctx := ctxT(t, 180*time.Second)
	w := startWaypointMesh(t, ctx, waypointSpec{Namespace: "egress", Service: "app",
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {})})
	m := w.Mesh
	if err := m.AddNamespace("external", nil); err != nil {
		t.Fatal(err)
	}
	ext, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "tls-server", Namespace: "external"})
	if err != nil {
		t.Fatal(err)
	}
	serverCA, clientCA := newTestCA(t, "external server CA"), newTestCA(t, "egress client CA")
	srvCert, srvKey := serverCA.issue(t, "api.example.test", x509.ExtKeyUsageServerAuth, "api.example.test")
	cliCert, cliKey := clientCA.issue(t, "egress-client", x509.ExtKeyUsageClientAuth)
	kp, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	clientRoots := x509.NewCertPool()
	clientRoots.AddCert(clientCA.cert)
	var mu sync.Mutex
	var seen []string // "host sni client-cn" of each request the server got
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			cn := ""
			if len(r.TLS.PeerCertificates) > 0 {
				cn = r.TLS.PeerCertificates[0].Subject.CommonName
			}
			mu.Lock()
			seen = append(seen, r.Host+" "+r.TLS.ServerName+" "+cn)
			mu.Unlock()
			fmt.Fprintf(rw, "host=%s sni=%s client=%s", r.Host, r.TLS.ServerName, cn)
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{kp}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: clientRoots},
		ReadHeaderTimeout: 10 * time.Second,
	}
	ln, err := ext.Listen(":443")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(tls.NewListener(ln, srv.TLSConfig)) }()
	t.Cleanup(func() { srv.Close() })

	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	var y strings.Builder
	fmt.Fprintf(&y, `apiVersion: v1
kind: Secret
metadata: {name: server-ca, namespace: egress}
data: {ca.crt: %s}
---
apiVersion: v1
kind: Secret
metadata: {name: client-cert, namespace: egress}
type: kubernetes.io/tls
data: {tls.crt: %s, tls.key: %s, ca.crt: %s}
`, b64(serverCA.pem), b64(cliCert), b64(cliKey), b64(serverCA.pem))
	for i, c := range []struct{ name, tls string }{
		{"simple", `{mode: SIMPLE, sni: api.example.test, subjectAltNames: [api.example.test], credentialName: server-ca}`},
		{"mutual", `{mode: MUTUAL, sni: api.example.test, credentialName: client-cert}`},
		{"badsan", `{mode: SIMPLE, sni: api.example.test, subjectAltNames: [wrong.example.test], credentialName: server-ca}`},
	} {
		fmt.Fprintf(&y, `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: %[1]s
  namespace: egress
  labels: {istio.io/use-waypoint: waypoint, istio.io/use-waypoint-namespace: demo}
spec:
  hosts: [%[1]s.example.test]
  addresses: [240.240.10.%[2]d]
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 443}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{address: %[3]s}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: %[1]s, namespace: egress}
spec:
  host: %[1]s.example.test
  trafficPolicy:
    tls: %[4]s
`, c.name, i+1, ext.IP, c.tls)
	}
	apply(t, m, "e2e-egress-tls", y.String())

	get := func(vip, host string) (int, string, error) {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return w.Client.Dial(ctx, "tcp", vip+":80") }}}
		resp, err := hc.Get("http://" + host + "/")
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	for _, c := range []struct{ vip, host, want string }{
		{"240.240.10.1", "simple.example.test", "host=simple.example.test sni=api.example.test client="},
		{"240.240.10.2", "mutual.example.test", "host=mutual.example.test sni=api.example.test client=egress-client"},
	} {
		testkit.EventuallyErr(t, 60*time.Second, c.host+" through TLS origination", func() error {
			code, body, err := get(c.vip, c.host)
			if err != nil || code != 200 || body != c.want {
				return fmt.Errorf("GET %s = %d %q (%v), want 200 %q", c.host, code, body, err, c.want)
			}
			return nil
		})
	}
	// The wrong SAN: 503 from the waypoint, never the request in plaintext
	// (the TLS server would answer that 400) nor over unverified TLS, nor
	// over a connection verified for another host of the same endpoint
	// address (each round first leaves such a connection idle).
	for range 3 {
		if code, body, err := get("240.240.10.1", "simple.example.test"); err != nil || code != 200 {
			t.Errorf("GET simple.example.test = %d %q (%v), want 200", code, body, err)
		}
		if code, body, err := get("240.240.10.3", "badsan.example.test"); err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("GET badsan.example.test = %d %q (%v), want 503", code, body, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		if strings.HasPrefix(s, "badsan.") {
			t.Errorf("the server got a request for badsan.example.test: %q", s)
		}
	}
}
