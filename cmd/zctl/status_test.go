package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/bootstrap"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/xdsserver"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/xdstest"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

type cpStub struct{ x *xdsserver.Server }

func (cpStub) ConfigDump() controlplane.ConfigDump { return controlplane.ConfigDump{} }
func (c cpStub) XDS() *xdsserver.Server            { return c.x }

// syncLab serves a real xDS server with a real node proxy client (which
// ACKs) and a raw stream that NACKs, behind the control plane's real admin
// handler; it returns the admin address and the server.
func syncLab(t *testing.T) (string, *xdsserver.Server) {
	t.Helper()
	x := xdsserver.NewServer(xdsserver.ServerConfig{})
	x.SetResources(xds.AddressType, map[string]proto.Message{"w1": &workloadapi.Address{
		Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{Uid: "w1", Name: "w1", Namespace: "demo"}}}})
	x.SetResources(xds.AuthorizationType, nil)
	gs := grpc.NewServer()
	x.Register(gs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := xds.NewClient(xds.ClientConfig{Address: ln.Addr().String(), Insecure: true, Sink: xdstest.NewSink(),
		Node: xds.NodeInfo{PodName: "ztunnel-a", PodNamespace: "istio-system", NodeName: "node-a", InstanceIPs: []string{"10.0.0.5"},
			Metadata: map[string]string{"ISTIO_VERSION": "9.9.9"}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	raw, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, Node: &core.Node{Id: "ztunnel~10.0.0.6~ztunnel-b.istio-system~istio-system.svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAME": structpb.NewStringValue("ztunnel-b"),
			"NAMESPACE": structpb.NewStringValue("istio-system"), "NODE_NAME": structpb.NewStringValue("node-b")}}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := raw.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: xds.AddressType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Message: `"w1": bad workload`}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "both streams settled", func() bool {
		synced, nacked := false, false
		for _, s := range x.Status() {
			for _, ty := range s.Types {
				synced = synced || (s.Pod == "istio-system/ztunnel-a" && ty.TypeURL == xds.AuthorizationType && ty.Sync == xds.SyncSynced)
				nacked = nacked || (s.Pod == "istio-system/ztunnel-b" && ty.NACK != "")
			}
		}
		return synced && nacked
	})
	o := bootstrap.Options{AdminAddr: "localhost:0"}
	var admin *httptest.Server
	for _, sp := range bootstrap.Servers(o, cpStub{x}, prometheus.NewRegistry(), zap.NewAtomicLevel(), daemon.NewReadiness()) {
		if sp.Name == "admin" {
			admin = httptest.NewServer(sp.Handler)
		}
	}
	t.Cleanup(admin.Close)
	return strings.TrimPrefix(admin.URL, "http://"), x
}

func TestStatusLive(t *testing.T) {
	addr, x := syncLab(t)
	var out bytes.Buffer
	if err := run([]string{"status", "--cp-admin", addr}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := map[string]bool{}
	ageCol := regexp.MustCompile(` (AGE|[0-9][0-9hms]*s) `) // AGE moves
	for _, l := range strings.Split(out.String(), "\n") {
		lines[ageCol.ReplaceAllString(strings.Join(strings.Fields(l), " "), " ")] = true
	}
	for _, w := range []string{
		"# control plane: admin http://" + addr + "/debug/syncz (2 streams)",
		"NAME KIND NODE VERSION TYPE STATUS SENT ACKED RESOURCES NACK",
		"istio-system/ztunnel-b node proxy node-b - Address STALE 1 - 1 \"w1\": bad workload",
	} {
		if !lines[w] {
			t.Errorf("no line %q in\n%s", w, out.String())
		}
	}
	if !strings.Contains(out.String(), "istio-system/ztunnel-a  node proxy  node-a  9.9.9") ||
		strings.Count(out.String(), "SYNCED") != 2 {
		t.Errorf("ztunnel-a is not SYNCED on both types:\n%s", out.String())
	}

	// -o json carries the server's fields: the mirror agrees with xds.StreamStatus.
	out.Reset()
	if err := run([]string{"status", "--cp-admin", addr, "-o", "json"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	var got syncStatus
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.ControlPlane != "admin http://"+addr+"/debug/syncz" || len(got.Streams) != 2 {
		t.Fatalf("json: %+v", got)
	}
	srvJSON, _ := json.Marshal(bootstrap.SyncStatus{Streams: x.Status()})
	got.ControlPlane = ""
	mirrorJSON, _ := json.Marshal(got)
	var a, b any
	_ = json.Unmarshal(srvJSON, &a)
	_ = json.Unmarshal(mirrorJSON, &b)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("mirror differs from the server's status:\nserver %s\nmirror %s", srvJSON, mirrorJSON)
	}

	// A saved copy reads the same and says so.
	p := filepath.Join(t.TempDir(), "syncz.json")
	if err := os.WriteFile(p, srvJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run([]string{"status", "-f", p, "-o", "yaml"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "controlPlane: file "+p) || !strings.Contains(out.String(), "sync: STALE") {
		t.Errorf("yaml from file:\n%s", out.String())
	}
	if err := run([]string{"status", "-f", p, "extra"}, &out, &out); err == nil {
		t.Error("status accepted an argument")
	}
	if err := run([]string{"status", "--cp-admin", "127.0.0.1:1"}, &out, &out); err == nil || !strings.Contains(err.Error(), "--cp-admin") {
		t.Errorf("unreachable control plane: %v", err)
	}
}

// TestDefaultAdminAddrs: zctl's defaults are the binaries' own.
func TestDefaultAdminAddrs(t *testing.T) {
	if defaultCPAdmin != bootstrap.DefaultAdminAddr {
		t.Errorf("--cp-admin default %s, ztunnel-cp's %s", defaultCPAdmin, bootstrap.DefaultAdminAddr)
	}
}
