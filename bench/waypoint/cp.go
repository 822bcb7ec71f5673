package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/xdsserver"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// The mesh the waypoint serves, in the objects a cluster would hold: the
// control plane's own translation (translate.Translate and
// translate.WaypointConfigs, as ztunnel-cp runs them) turns it into the
// workload API and the waypoint's config, so the figure is for the policy
// and route a user writes, not a hand-built config. Every "pod" is its own
// loopback address (127.78.0.0/24: the waypoint package's tests use
// 127.77.0.0/24), since routing sends HBONE to podIP:15008.
const (
	wpIP     = "127.78.0.1"
	serverIP = "127.78.0.11"
	clientIP = "127.78.0.21"
	svcVIP   = "10.96.78.10"
	wpVIP    = "10.96.78.1"
	// appPort is the server app's port (the Service's targetPort),
	// tlsPort the TLS terminator in front of it (the HAProxy path's
	// server side) and HAProxy's own listener.
	appPort = 8080
	tlsPort = 15443
	svcHost = "server.bench.svc.cluster.local"
	// benchPath is what the load requests; deniedPath what the DENY
	// policy refuses (checked once before the rounds).
	benchPath  = "/api/echo"
	deniedPath = "/admin/users"
	nodeName   = "node0"
	gatewayRef = "bench/waypoint"
)

// meshYAML: the waypoint Gateway and its Service; the server behind a
// Service bound to the waypoint (istio.io/use-waypoint); an
// AuthorizationPolicy with targetRefs to the Gateway that ALLOWs only the
// client's principal to POST under /api/ (so an ALLOW selects: everything
// else is denied), one that DENYs /admin*, and an HTTPRoute on the Service
// (GAMMA) matching POST /api with a RequestHeaderModifier, to the server.
var meshYAML = template.Must(template.New("mesh").Parse(`
apiVersion: v1
kind: Namespace
metadata: {name: bench, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: bench, annotations: {ztunnel-go.io/waypoint-address: {{.WpVIP}}}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: bench}
spec:
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  clusterIP: {{.WpVIP}}
  ports: [{name: mesh, port: 15008}]
---
apiVersion: v1
kind: Pod
metadata: {name: waypoint, namespace: bench, labels: {gateway.networking.k8s.io/gateway-name: waypoint, istio.io/dataplane-mode: none}}
spec: {nodeName: {{.Node}}, serviceAccountName: waypoint, containers: [{name: istio-proxy, image: waypoint}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: {{.WpIP}}}]}
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: bench, labels: {istio.io/use-waypoint: waypoint}}
spec:
  selector: {app: server}
  clusterIP: {{.SvcVIP}}
  ports: [{name: http, port: 80, targetPort: {{.AppPort}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: server, namespace: bench, labels: {app: server}}
spec: {nodeName: {{.Node}}, serviceAccountName: server, containers: [{name: app, image: app, ports: [{containerPort: {{.AppPort}}}]}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: {{.ServerIP}}}]}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: bench, labels: {app: client}}
spec: {nodeName: {{.Node}}, serviceAccountName: client, containers: [{name: app, image: client}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: {{.ClientIP}}}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client-api, namespace: bench}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/bench/sa/client"]}}]
    to: [{operation: {methods: [POST], paths: ["/api/*"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: bench}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: server-api, namespace: bench}
spec:
  parentRefs: [{group: "", kind: Service, name: server, port: 80}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /api}, method: POST}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-route, value: server-api}], remove: [x-drop]}
    backendRefs: [{name: server, port: 80}]
`))

// controlPlane is a local control plane for the waypoint: the xDS server
// (the workload API and the waypoint's config) and the CA, over TLS gRPC
// with node-token authentication, as ztunnel-cp serves them.
type controlPlane struct {
	addr     string
	rootFile string
	token    string
	stop     func()
}

// meshResources translates meshYAML as the control plane does and returns
// the workload API resources and the waypoint's config, checked: every
// policy enforced by the waypoint as written, the server's Service bound
// with its route, both policies in the config.
func meshResources() (addrs, authz map[string]proto.Message, wc *waypointapi.Config, err error) {
	var y strings.Builder
	if err := meshYAML.Execute(&y, map[string]any{
		"WpIP": wpIP, "WpVIP": wpVIP, "ServerIP": serverIP, "ClientIP": clientIP, "SvcVIP": svcVIP,
		"AppPort": appPort, "Node": nodeName,
	}); err != nil {
		return nil, nil, nil, err
	}
	var objs cluster.Objects
	if errs := cluster.Decode("bench-waypoint.yaml", []byte(y.String()), &objs); len(errs) > 0 {
		return nil, nil, nil, fmt.Errorf("the bench mesh: %v", errs)
	}
	objs.Sort()
	cfg := translate.LocalDefaults()
	res := translate.Translate(cfg, &objs, nil)
	wps, statuses := translate.WaypointConfigs(cfg, &objs, res)
	for _, w := range res.Warnings {
		// Translate alone does not know the waypoint configs exist yet;
		// the statuses below are WaypointConfigs' word on those policies.
		if !strings.Contains(w, "no waypoint enforces policies") {
			logf("translation warning: %s", w)
		}
	}
	for _, s := range statuses {
		if len(s.Invalid) > 0 || !strings.Contains(s.Message, "enforced by waypoint "+gatewayRef) {
			return nil, nil, nil, fmt.Errorf("the bench mesh: %s %s is not enforced by the waypoint as written: %s %v", s.Kind, s.Name, s.Message, s.Invalid)
		}
	}
	wc = wps[gatewayRef]
	if wc == nil || len(wc.GetServices()) != 1 || len(wc.GetServices()[0].GetRoutes()) != 1 || len(wc.GetPolicies()) != 2 {
		return nil, nil, nil, fmt.Errorf("the bench mesh: waypoint config %v, want the server bound with one route and two policies", wc)
	}

	addrs = map[string]proto.Message{}
	for k, v := range res.Addresses.All() {
		addrs[k] = v
	}
	authz = map[string]proto.Message{}
	for k, v := range res.Authorizations {
		authz[k] = v
	}
	return addrs, authz, wc, nil
}

func startControlPlane(authority *ca.CA, dir string) (*controlPlane, error) {
	addrs, authz, wc, err := meshResources()
	if err != nil {
		return nil, err
	}
	srv := xdsserver.NewServer(xdsserver.ServerConfig{})
	srv.SetResources(xds.AddressType, addrs)
	srv.SetResources(xds.AuthorizationType, authz)
	srv.SetResources(xds.WaypointType, map[string]proto.Message{gatewayRef: wc})

	cp := &controlPlane{token: "bench-waypoint-node-token", rootFile: filepath.Join(dir, "root-cert.pem")}
	if err := os.WriteFile(cp.rootFile, authority.RootPEM(), 0o600); err != nil {
		return nil, err
	}
	auth, err := caserver.NewNodeTokens(map[string]string{nodeName: cp.token})
	if err != nil {
		return nil, err
	}
	// The waypoint's pod runs on the node whose token it presents.
	casrv, err := caserver.New(caserver.Config{CA: authority, Auth: auth, Placement: caserver.PlacementFunc(
		func(node, ns, sa string) bool { return node == nodeName && ns == "bench" && sa == "waypoint" })})
	if err != nil {
		return nil, err
	}
	cert, err := caserver.ServingCertificate(authority, []string{"127.0.0.1"}, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})),
		grpc.UnaryInterceptor(caserver.UnaryInterceptor(auth, nil)),
		grpc.StreamInterceptor(caserver.StreamInterceptor(auth, nil)),
	)
	srv.Register(g)
	casrv.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cp.addr = ln.Addr().String()
	go g.Serve(ln)
	cp.stop = g.Stop
	return cp, nil
}
