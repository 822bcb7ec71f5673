package interop

// ourObjects are the e2e-like objects both control planes read beside
// Istio's bookinfo sample: ambient namespaces, a waypoint that istiod can
// mark Programmed without its injector (a Service labelled as istiod's
// deployment controller labels it, and an EndpointSlice), ports of every appProtocol
// family, a ServiceEntry, an ExternalName alias and AuthorizationPolicies
// including a root-namespace DENY by selector and an AUDIT. Pods are
// created separately (podsFor) because their status is written as kubelet
// would.
const ourObjects = `
apiVersion: v1
kind: Namespace
metadata:
  name: app
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: bookinfo
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: samples
  labels:
    istio.io/dataplane-mode: ambient
---
apiVersion: v1
kind: Namespace
metadata:
  name: wp
  labels:
    istio.io/dataplane-mode: ambient
    istio.io/use-waypoint: waypoint
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: app
spec:
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
  - name: https
    port: 443
    targetPort: 8443
  - name: tcp-raw
    port: 9000
  - name: grpc
    port: 9090
    appProtocol: grpc
---
apiVersion: v1
kind: Service
metadata:
  name: alias
  namespace: app
spec:
  type: ExternalName
  externalName: web.app.svc.cluster.local
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: external-api
  namespace: app
spec:
  hosts:
  - api.example.com
  addresses:
  - 240.240.0.10
  ports:
  - name: http
    number: 80
    protocol: HTTP
  - name: tls
    number: 443
    protocol: TLS
  - name: tcp
    number: 5432
    protocol: TCP
    targetPort: 15432
  location: MESH_EXTERNAL
  resolution: DNS
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: waypoint
  namespace: wp
  labels:
    istio.io/waypoint-for: service
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - name: mesh
    port: 15008
    protocol: HBONE
---
apiVersion: v1
kind: Service
metadata:
  name: waypoint
  namespace: wp
  labels:
    gateway.networking.k8s.io/gateway-name: waypoint
    gateway.istio.io/managed: istio.io-mesh-controller
    istio.io/gateway-name: waypoint
spec:
  selector:
    gateway.networking.k8s.io/gateway-name: waypoint
  ports:
  - name: mesh
    port: 15008
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: waypoint-1
  namespace: wp
  labels:
    kubernetes.io/service-name: waypoint
addressType: IPv4
endpoints:
- addresses:
  - 10.40.0.30
  conditions:
    ready: true
  targetRef:
    kind: Pod
    name: waypoint-0
    namespace: wp
ports:
- name: mesh
  port: 15008
  protocol: TCP
---
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: wp
spec:
  selector:
    app: api
  ports:
  - name: http
    port: 8080
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: allow-client
  namespace: app
spec:
  selector:
    matchLabels:
      app: web
  action: ALLOW
  rules:
  - from:
    - source:
        principals: ["cluster.local/ns/app/sa/client"]
    to:
    - operation:
        ports: ["8080"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: allow-l7
  namespace: app
spec:
  selector:
    matchLabels:
      app: client
  action: ALLOW
  rules:
  - to:
    - operation:
        paths: ["/admin"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: audit-all
  namespace: app
spec:
  action: AUDIT
  rules:
  - {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-evil-web
  namespace: istio-system
spec:
  selector:
    matchLabels:
      app: web
  action: DENY
  rules:
  - from:
    - source:
        namespaces: ["evil"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-ipblocks
  namespace: istio-system
spec:
  action: DENY
  rules:
  - from:
    - source:
        ipBlocks: ["203.0.113.0/24"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: productpage-viewer
  namespace: bookinfo
spec:
  selector:
    matchLabels:
      app: productpage
  action: ALLOW
  rules:
  - from:
    - source:
        namespaces: ["bookinfo", "app"]
      source:
        notPrincipals: ["cluster.local/ns/app/sa/web"]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata:
  name: strict
  namespace: app
spec:
  mtls:
    mode: STRICT
`

// extraPod is a pod of ourObjects (bookinfo's come from its Deployments).
type extraPod struct {
	ns, name, sa string
	labels       map[string]string
	ip           string
}

var ourPods = []extraPod{
	{ns: "app", name: "web-0", sa: "web", labels: map[string]string{"app": "web"}, ip: "10.40.0.10"},
	{ns: "app", name: "client-0", sa: "client", labels: map[string]string{"app": "client"}, ip: "10.40.0.11"},
	{ns: "wp", name: "api-0", sa: "api", labels: map[string]string{"app": "api"}, ip: "10.40.0.20"},
	{ns: "wp", name: "waypoint-0", sa: "waypoint", labels: map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint"}, ip: "10.40.0.30"},
}
