package webhook

import (
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// meshYAML is the mesh every case is translated in: a waypoint with a
// Service bound to it, so targetRef policies reach a waypoint config.
const meshYAML = `
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo, annotations: {ztunnel-go.io/waypoint-address: 10.96.9.1}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec: {selector: {app: web}, clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: demo, labels: {app: web}}
spec: {nodeName: node0, serviceAccountName: web, containers: [{name: app, image: app}]}
status: {phase: Running, conditions: [{type: Ready, status: "True"}], podIPs: [{ip: 10.0.0.1}]}
`

// TestWebhookMatchesControlPlane feeds the same AuthorizationPolicies to the
// webhook and to translation (node proxies' and waypoints'): the webhook
// refuses exactly the policies whose status names values that cannot be
// enforced, and names the same fields. wantField is a field path both
// must name ("" for a policy both accept).
func TestWebhookMatchesControlPlane(t *testing.T) {
	const wp = "targetRefs: [{kind: Service, group: \"\", name: web}]\n  "
	cases := []struct {
		name, spec, wantField string
	}{
		// Waypoint (targetRefs) policies.
		{"wp serviceAccounts", wp + `rules: [{from: [{source: {serviceAccounts: [curl, other/sa]}}]}]`, ""},
		{"wp serviceAccounts with principals", wp + `rules: [{from: [{source: {serviceAccounts: [curl], principals: ["cluster.local/ns/demo/sa/x"]}}]}]`, "spec.rules[0].from[0].source"},
		{"wp serviceAccounts wildcard", wp + `rules: [{from: [{source: {notServiceAccounts: ["demo/*"]}}]}]`, "spec.rules[0].from[0].source.notServiceAccounts[0]"},
		{"wp serviceAccounts three parts", wp + `rules: [{from: [{source: {serviceAccounts: [a/b/c]}}]}]`, "spec.rules[0].from[0].source.serviceAccounts[0]"},
		{"wp when source.ip /33", wp + `rules: [{when: [{key: source.ip, values: [10.1.0.0/33]}]}]`, "spec.rules[0].when[0].values[0]"},
		{"wp when remote.ip", wp + `action: DENY
  rules: [{when: [{key: remote.ip, notValues: [10.1.0.0/16, "not-an-ip"]}]}]`, "spec.rules[0].when[0].notValues[1]"},
		{"wp when destination.port in DENY", wp + `action: DENY
  rules: [{when: [{key: destination.port, values: [http]}]}]`, "spec.rules[0].when[0].values[0]"},
		{"wp when source.serviceAccount", wp + `rules: [{when: [{key: source.serviceAccount, values: [demo/curl, curl]}]}]`, ""},
		{"wp when no values", wp + `rules: [{when: [{key: source.namespace}]}]`, "spec.rules[0].when[0]"},
		{"wp when connection.sni", wp + `rules: [{when: [{key: connection.sni, values: [web]}]}]`, "spec.rules[0].when[0].key"},
		{"wp when experimental", wp + `action: DENY
  rules: [{when: [{key: "experimental.envoy.filters.network.mysql_proxy[db.table]", values: ["[update]"]}]}]`, "spec.rules[0].when[0].key"},
		{"wp when bad header key", wp + `rules: [{when: [{key: "request.headers[]", values: [x]}]}]`, "spec.rules[0].when[0].key"},
		{"wp when header", wp + `rules: [{when: [{key: "request.headers[x-user]", values: ["*bob*"]}]}]`, ""},
		{"wp when claims", wp + `rules: [{when: [{key: "request.auth.claims[groups][0]", values: [dev]}]}]`, ""},
		{"wp when bad claims", wp + `rules: [{when: [{key: "request.auth.claims[]", values: [dev]}]}]`, "spec.rules[0].when[0].key"},
		{"wp unknown key", wp + `rules: [{when: [{key: "destination.labels[app]", values: [x]}]}]`, "spec.rules[0].when[0].key"},
		{"wp lower-case method", wp + `action: DENY
  rules: [{to: [{operation: {methods: [delete]}}]}]`, "spec.rules[0].to[0].operation.methods[0]"},
		{"wp path template", wp + `rules: [{to: [{operation: {paths: ["/api/{*}/x"]}}]}]`, "spec.rules[0].to[0].operation.paths[0]"},
		{"wp path without slash", wp + `action: DENY
  rules: [{to: [{operation: {paths: ["admin*"]}}]}]`, "spec.rules[0].to[0].operation.paths[0]"},
		{"wp middle wildcard host", wp + `rules: [{to: [{operation: {hosts: ["a*.b"]}}]}]`, "spec.rules[0].to[0].operation.hosts[0]"},
		{"wp empty source", wp + `rules: [{from: [{source: {}}]}]`, "spec.rules[0].from[0].source"},
		{"wp empty operation", wp + `action: DENY
  rules: [{to: [{operation: {}}]}]`, "spec.rules[0].to[0].operation"},
		{"wp principal with scheme", wp + `rules: [{from: [{source: {principals: ["spiffe://cluster.local/ns/demo/sa/curl"]}}]}]`, "spec.rules[0].from[0].source.principals[0]"},
		{"wp remoteIpBlocks", wp + `rules: [{from: [{source: {remoteIpBlocks: [10.0.0.0/8, 300.1.1.1]}}]}]`, "spec.rules[0].from[0].source.remoteIpBlocks[1]"},
		{"wp CUSTOM", wp + `action: CUSTOM
  provider: {name: ext}
  rules: [{}]`, "spec.action"},
		{"wp good L7", wp + `rules: [{from: [{source: {requestPrincipals: ["iss/*"], trustDomains: [cluster.local]}}], to: [{operation: {methods: [GET], paths: ["/public*"], hosts: ["web.demo.svc.cluster.local"]}}]}]`, ""},
		// Node proxy (selector / namespace) policies.
		{"node good", `action: DENY
  rules: [{from: [{source: {ipBlocks: [10.1.0.0/16]}}]}]`, ""},
		{"node bad CIDR", `action: DENY
  rules: [{from: [{source: {ipBlocks: [10.1.0.0/33]}}]}]`, "spec.rules[0].from[0].source.ipBlocks[0]"},
		{"node when source.ip /33", `rules: [{when: [{key: source.ip, values: [10.1.0.0/33]}]}]`, "spec.rules[0].when[0].values[0]"},
		{"node serviceAccounts", `selector: {matchLabels: {app: web}}
  rules: [{from: [{source: {serviceAccounts: [curl]}}]}]`, ""},
		{"node dry-run annotation", `action: DENY
  rules: [{}]`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ap := "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: demo}\nspec:\n  " + tc.spec + "\n"
			raw, err := yaml.YAMLToJSON([]byte(ap))
			if err != nil {
				t.Fatal(err)
			}
			refused := Validate("", raw)

			var objs cluster.Objects
			if errs := cluster.Decode("mesh.yaml", []byte(meshYAML+"---\n"+ap), &objs); len(errs) > 0 {
				t.Fatalf("decode: %v", errs)
			}
			objs.Sort()
			cfg := translate.Config{}
			res := translate.Translate(cfg, &objs, nil)
			_, statuses := translate.WaypointConfigs(cfg, &objs, res)
			i := slices.IndexFunc(statuses, func(s translate.PolicyStatus) bool {
				return s.Kind == "AuthorizationPolicy" && s.Name == "demo/p"
			})
			if i < 0 {
				t.Fatalf("no status for demo/p in %+v", statuses)
			}
			invalid := statuses[i].Invalid

			var want []string
			for _, p := range invalid {
				want = append(want, "AuthorizationPolicy demo/p: "+p)
			}
			if !slices.Equal(refused, want) {
				t.Errorf("webhook refused %q;\ncontrol plane's status names %q", refused, invalid)
			}
			named := slices.ContainsFunc(invalid, func(p string) bool { return strings.HasPrefix(p, tc.wantField+": ") })
			switch {
			case tc.wantField == "" && len(invalid) > 0:
				t.Errorf("refused %q, want accepted", invalid)
			case tc.wantField != "" && !named:
				t.Errorf("refusal %q does not name %s", invalid, tc.wantField)
			case tc.wantField != "" && !strings.Contains(statuses[i].Message, tc.wantField):
				t.Errorf("status message %q does not name %s", statuses[i].Message, tc.wantField)
			}
		})
	}
}

// TestWebhookMatchesControlPlaneIstioRouting does the same for
// DestinationRules and VirtualServices (their status, from the waypoint
// configs), ServiceEntries (the control plane's refusal of an address no
// namespace may claim) and HTTPRoutes (the Accepted condition the control
// plane writes into status.parents): the webhook refuses exactly what the
// control plane refuses without looking at the rest of the cluster.
func TestWebhookMatchesControlPlaneIstioRouting(t *testing.T) {
	cases := []struct {
		name, kind, doc, wantField string
	}{
		{"dr ok", "DestinationRule", "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: o, namespace: demo}\nspec: {host: web, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}", ""},
		{"dr connectionPool ok", "DestinationRule", "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: o, namespace: demo}\nspec: {host: web, trafficPolicy: {connectionPool: {tcp: {maxConnections: 1}}}}", ""},
		{"dr connectionPool keepalive", "DestinationRule", "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: o, namespace: demo}\nspec: {host: web, trafficPolicy: {connectionPool: {tcp: {tcpKeepalive: {probes: 3}}}}}", "spec.trafficPolicy.connectionPool.tcp.tcpKeepalive"},
		{"dr unused subset's policy", "DestinationRule", "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: o, namespace: demo}\nspec: {host: web, subsets: [{name: v1, labels: {v: \"1\"}, trafficPolicy: {loadBalancer: {warmupDurationSecs: 10s}}}]}", "spec.subsets[0].trafficPolicy.loadBalancer.warmupDurationSecs"},
		{"dr bad exportTo", "DestinationRule", "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: o, namespace: demo}\nspec: {host: web, exportTo: [\"*\", other]}", "spec.exportTo[0]"},
		{"vs bad exportTo", "VirtualService", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: o, namespace: demo}\nspec: {hosts: [web], exportTo: [Not_A_Namespace], http: [{route: [{destination: {host: web}}]}]}", "spec.exportTo[0]"},
		{"vs ok", "VirtualService", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: o, namespace: demo}\nspec: {hosts: [web], exportTo: [.], http: [{route: [{destination: {host: web}}]}]}", ""},
		{"se every address", "ServiceEntry", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: o, namespace: demo}\nspec: {hosts: [x.example], addresses: [0.0.0.0/0], ports: [{number: 80, name: http, protocol: HTTP}], resolution: NONE}", "spec.addresses[0]"},
		{"se ok", "ServiceEntry", "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: o, namespace: demo}\nspec: {hosts: [x.example], addresses: [192.0.2.0/24], ports: [{number: 80, name: http, protocol: HTTP}], resolution: NONE}", ""},
		{"route backoff", "HTTPRoute", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: o, namespace: demo}\nspec: {parentRefs: [{group: \"\", kind: Service, name: web}], rules: [{retry: {attempts: 1, backoff: 1s}, backendRefs: [{name: web, port: 80}]}]}", "spec.rules[0].retry.backoff"},
		{"route ok", "HTTPRoute", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: o, namespace: demo}\nspec: {parentRefs: [{group: \"\", kind: Service, name: web}], rules: [{timeouts: {backendRequest: 1s}, backendRefs: [{name: web, port: 80}]}]}", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := yaml.YAMLToJSON([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			refused := Validate("", raw)
			var objs cluster.Objects
			if errs := cluster.Decode("mesh.yaml", []byte(meshYAML+"---\n"+tc.doc), &objs); len(errs) > 0 {
				t.Fatalf("decode: %v", errs)
			}
			objs.Sort()
			cfg := translate.Config{}
			res := translate.Translate(cfg, &objs, nil)
			_, statuses := translate.WaypointConfigs(cfg, &objs, res)
			// What the control plane says of the object, wherever it says it.
			var said []string
			for _, s := range statuses {
				if s.Kind == tc.kind && s.Name == "demo/o" {
					said = append(said, s.Invalid...)
				}
			}
			for _, rs := range translate.RouteStatuses(cfg, &objs) {
				if rs.Kind == tc.kind && rs.Name == "o" {
					for _, p := range rs.Parents {
						if !p.Accepted.Status {
							said = append(said, p.Accepted.Message)
						}
					}
				}
			}
			names := func(list []string) bool {
				return slices.ContainsFunc(list, func(p string) bool { return strings.Contains(p, tc.wantField) })
			}
			switch {
			case tc.wantField == "" && (len(refused) > 0 || len(said) > 0):
				t.Errorf("webhook refused %q, control plane said %q; want both to accept", refused, said)
			case tc.wantField != "" && (!names(refused) || !names(said)):
				t.Errorf("webhook refused %q, control plane said %q; want both to name %s", refused, said, tc.wantField)
			}
		})
	}
}
