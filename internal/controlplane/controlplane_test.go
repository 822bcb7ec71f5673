package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/xdstest"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

const podYAML = `apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: demo, labels: {istio.io/dataplane-mode: ambient}}
spec: {nodeName: node0, serviceAccountName: %s, containers: [{name: app, image: app}]}
status: {phase: Running, podIPs: [{ip: %s}]}
`

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestControlPlaneEndToEnd(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "pods.yaml"), fmt.Sprintf(podYAML, "client", "client", "10.0.0.1"))
	writeFile(t, filepath.Join(dir, "bad.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {nodeName: 7, bogus: 1}\n")

	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, _ := caserver.NewNodeTokens(map[string]string{"node0": "tok0", "node1": "tok1"})
	src := local.New(dir, nil, 20*time.Millisecond)
	cp, err := New(Config{Source: src, SourceErrors: src.Errors, Translate: translate.LocalDefaults(), CA: c, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cp.Run(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	pool := x509.NewCertPool()
	pool.AddCert(c.Root())
	s := xdstest.NewSink()
	client, err := xds.NewClient(xds.ClientConfig{
		Address: lis.Addr().String(), RootCAs: pool, ServerName: "istiod.istio-system.svc", Token: "tok0",
		Node: xds.NodeInfo{PodName: "ztunnel-0", PodNamespace: "istio-system", InstanceIPs: []string{"10.30.0.1"}, NodeName: "node0"},
		Sink: s,
	})
	if err != nil {
		t.Fatal(err)
	}
	go client.Run(ctx)

	uid := func(name string) string { return "Kubernetes//Pod/demo/" + name }
	s.WaitFor(t, 20*time.Second, "the client pod", func() bool { return s.Address(uid("client")) != nil })
	if got := s.Address(uid("client")).GetWorkload().GetTunnelProtocol(); got != workloadapi.TunnelProtocol_HBONE {
		t.Errorf("tunnel protocol = %v, want HBONE (enrolled from labels)", got)
	}

	// A change of the directory is pushed.
	writeFile(t, filepath.Join(dir, "pods.yaml"), fmt.Sprintf(podYAML, "client", "client", "10.0.0.1")+"---\n"+fmt.Sprintf(podYAML, "server", "server", "10.0.0.2"))
	s.WaitFor(t, 20*time.Second, "the server pod", func() bool { return s.Address(uid("server")) != nil })

	// The dump shows objects and the bad document with its file.
	d := cp.ConfigDump()
	if d.Generation == 0 || len(d.Objects["Pod"]) != 2 || len(d.SourceErrors) != 1 || len(d.Addresses) != 2 {
		t.Errorf("config dump = %+v", d)
	}
	if len(d.SourceErrors) == 1 && !strings.Contains(d.SourceErrors[0], "bad.yaml") {
		t.Errorf("source error %q does not name the file", d.SourceErrors[0])
	}

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	authed := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}

	// CA on the same port: node0 may get demo/server (it runs there), node1 may not.
	id := identity.MustNew("cluster.local", "demo", "server")
	key, _ := identity.GenerateKey()
	csr, _ := identity.NewCSR(id, key)
	cac := caapi.NewIstioCertificateServiceClient(conn)
	resp, err := cac.CreateCertificate(authed("tok0"), &caapi.IstioCertificateRequest{Csr: string(csr)})
	if err != nil {
		t.Fatalf("node0 certificate: %v", err)
	}
	if _, err := identity.FromChain(id, key, resp.CertChain); err != nil {
		t.Errorf("issued chain: %v", err)
	}
	_, err = cac.CreateCertificate(authed("tok1"), &caapi.IstioCertificateRequest{Csr: string(csr)})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("node1 asking for a node0 identity: %v, want PermissionDenied", err)
	}

	// xDS with a bad token is refused.
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(authed("nope"))
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("xDS with a bad token: %v, want Unauthenticated", err)
	}
}
