package apicoverage

// State is what ztunnel-go does with a field.
type State int

const (
	// Enforced: the field means what its API says; Test proves it.
	Enforced State = iota + 1
	// Refused: an object or rule that sets the field is rejected and fails
	// closed, with a message where users look; Test proves the refusal.
	Refused
	// NotApplicable: the field has no meaning for a mesh without sidecars
	// and gateways of its own (a sidecar injection setting, a load
	// balancer's node port), or is read by another component; Note says why.
	NotApplicable
)

func (s State) String() string {
	switch s {
	case Enforced:
		return "enforced"
	case Refused:
		return "refused"
	case NotApplicable:
		return "not applicable"
	}
	return "unknown"
}

// Entry decides one field. An entry covers its field and every field
// below it that has no entry of its own.
type Entry struct {
	Path  string
	State State
	// Test names the test that proves the field's meaning (Enforced) or
	// its refusal (Refused): a Go test function of this module, optionally
	// with a subtest ("TestX/case").
	Test string
	// Note says what happens (Refused) or why the field does not apply
	// (NotApplicable); for Enforced it may add a limit worth knowing.
	Note string
}

func enf(path, test string, note ...string) Entry {
	return Entry{Path: path, State: Enforced, Test: test, Note: first(note)}
}

func ref(path, test, note string) Entry {
	return Entry{Path: path, State: Refused, Test: test, Note: note}
}

func na(path, why string) Entry { return Entry{Path: path, State: NotApplicable, Note: why} }

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// Shared notes.
const (
	ruleAnswers500 = "the rule that sets it answers 500 and the object's status names the field"
	destAnswers500 = "requests to the destination answer 500 and the object's status names the field"
	notReadKind    = "the kind is not read: the control plane and `zctl analyze` report every such object as having no effect"
	sidecarOnly    = "configures Istio's sidecar injector or the sidecar proxy; ambient pods have no sidecar"
	gatewayOnly    = "applies to Istio's ingress and egress gateway deployments, which ztunnel-go does not run"
	lbService      = "load balancer or node port plumbing of kube-proxy and the cloud provider; the mesh keys on the ClusterIP and ports"
	k8sRuntime     = "read by the kubelet and the container runtime, not by the mesh"
	metaBookkeep   = "API server bookkeeping"
)

// table decides every field of every kind (Kinds). TestFieldCoverage
// requires each field to be decided exactly once.
var table = map[string][]Entry{
	"AuthorizationPolicy": {
		enf("spec.selector", "TestRootNamespaceSelectorDeny", "in the root namespace it selects workloads of every namespace"),
		enf("spec.targetRef", "TestWaypointConfigs", "attaches to a waypoint Gateway, a Service or a ServiceEntry of the policy's namespace; a namespace other than the policy's attaches to nothing and the status says so"),
		enf("spec.targetRefs[]", "TestWaypointConfigs", "as targetRef"),
		enf("spec.action", "TestIstioPolicies", "ALLOW, DENY and AUDIT; CUSTOM is refused (see provider)"),
		ref("spec.provider", "TestRefusedFieldsAreRefused", "CUSTOM (ext_authz) is not implemented: a CUSTOM policy is not sent to node proxies and denies every request at a waypoint; a provider beside another action (invalid in Istio) drops an ALLOW policy's rules or makes a DENY policy deny everything; the status says which"),
		enf("spec.rules[]", "TestIstioPolicies"),
		enf("spec.rules[].from[]", "TestIstioPolicies"),
		enf("spec.rules[].from[].source", "TestIstioPolicies"),
		enf("spec.rules[].from[].source.principals[]", "TestIstioPolicies"),
		enf("spec.rules[].from[].source.notPrincipals[]", "TestIstioPolicies"),
		enf("spec.rules[].from[].source.namespaces[]", "TestIstioPolicies"),
		enf("spec.rules[].from[].source.notNamespaces[]", "TestIstioPolicies"),
		enf("spec.rules[].from[].source.ipBlocks[]", "TestInvalidFailsClosed", "an address or range that does not parse fails closed"),
		enf("spec.rules[].from[].source.notIpBlocks[]", "TestInvalidFailsClosed"),
		enf("spec.rules[].from[].source.serviceAccounts[]", "TestWaypointAuthzSemantics", "namespace/name in any trust domain; beside principals or namespaces the rule is refused, as Istio's validation does"),
		enf("spec.rules[].from[].source.notServiceAccounts[]", "TestIstioFieldSemantics"),
		enf("spec.rules[].from[].source.requestPrincipals[]", "TestWaypointJWT", "at the waypoint; a node proxy cannot see a JWT, so there an ALLOW rule using it matches nothing and a DENY rule matches every request it could"),
		enf("spec.rules[].from[].source.notRequestPrincipals[]", "TestWaypointJWT", "as requestPrincipals"),
		enf("spec.rules[].from[].source.remoteIpBlocks[]", "TestIstioFieldSemantics", "at the waypoint: the connection's peer address, as Istio with numTrustedProxies 0 (X-Forwarded-For is never trusted); at a node proxy the rule fails closed"),
		enf("spec.rules[].from[].source.notRemoteIpBlocks[]", "TestIstioFieldSemantics", "as remoteIpBlocks"),
		enf("spec.rules[].from[].source.trustDomains[]", "TestIstioFieldSemantics", "at the waypoint; at a node proxy the rule fails closed"),
		enf("spec.rules[].from[].source.notTrustDomains[]", "TestIstioFieldSemantics", "as trustDomains"),
		enf("spec.rules[].to[]", "TestIstioPolicies"),
		enf("spec.rules[].to[].operation", "TestIstioPolicies"),
		enf("spec.rules[].to[].operation.ports[]", "TestIstioPolicies", "a port that is not a number fails closed"),
		enf("spec.rules[].to[].operation.notPorts[]", "TestIstioPolicies"),
		enf("spec.rules[].to[].operation.hosts[]", "TestWaypointAuthzSemantics", "at the waypoint, ignoring case, port and a trailing dot; at a node proxy the rule fails closed"),
		enf("spec.rules[].to[].operation.notHosts[]", "TestWaypointL7", "as hosts"),
		enf("spec.rules[].to[].operation.methods[]", "TestWaypointAuthzSemantics", "case-sensitive; a lower-case value is refused"),
		enf("spec.rules[].to[].operation.notMethods[]", "TestWaypointL7", "as hosts"),
		enf("spec.rules[].to[].operation.paths[]", "TestWaypointAuthzSemantics", "matched after the mesh's pathNormalization (BASE by default), which is also the path forwarded; at a node proxy the rule fails closed"),
		enf("spec.rules[].to[].operation.notPaths[]", "TestWaypointL7", "as hosts"),
		enf("spec.rules[].when[]", "TestIstioFieldSemantics", "every value parsed by its key; keys a proxy cannot evaluate, connection.sni and experimental.envoy.filters.* fail closed and the status names them"),
		enf("spec.rules[].when[].key", "TestValuesAndHeaders"),
		enf("spec.rules[].when[].values[]", "TestValuesAndHeaders"),
		enf("spec.rules[].when[].notValues[]", "TestValuesAndHeaders"),
		enf("metadata.annotations[istio.io/dry-run]", "TestDryRunAndAudit"),
	},
	"PeerAuthentication": {
		enf("spec.selector", "TestStaticStrict"),
		enf("spec.mtls", "TestStaticStrict"),
		enf("spec.mtls.mode", "TestStaticStrict", "STRICT, PERMISSIVE, DISABLE and UNSET as istiod converts them for node proxies"),
		enf("spec.portLevelMtls{}", "TestIstioPolicies", "only with a selector, as Istio requires"),
	},
	"RequestAuthentication": {
		enf("spec.selector", "TestWaypointRequestAuthentication", "attaches only through a waypoint; a selector policy is reported as not enforced by node proxies"),
		enf("spec.targetRef", "TestWaypointRequestAuthentication"),
		enf("spec.targetRefs[]", "TestWaypointRequestAuthentication"),
		enf("spec.jwtRules[]", "TestWaypointJWT"),
		enf("spec.jwtRules[].issuer", "TestAuthenticate"),
		enf("spec.jwtRules[].audiences[]", "TestAuthenticate"),
		enf("spec.jwtRules[].jwks", "TestAuthenticate"),
		enf("spec.jwtRules[].jwksUri", "TestRequestAuthenticationFetchesJwksURI"),
		enf("spec.jwtRules[].fromHeaders[]", "TestAuthenticateScopeAndHeaders"),
		enf("spec.jwtRules[].fromParams[]", "TestAuthenticateScopeAndHeaders"),
		enf("spec.jwtRules[].fromCookies[]", "TestAuthenticateScopeAndHeaders"),
		enf("spec.jwtRules[].forwardOriginalToken", "TestAuthenticateScopeAndHeaders"),
		enf("spec.jwtRules[].outputPayloadToHeader", "TestAuthenticateScopeAndHeaders"),
		enf("spec.jwtRules[].outputClaimToHeaders[]", "TestAuthenticateScopeAndHeaders"),
		enf("spec.jwtRules[].spaceDelimitedClaims[]", "TestAuthorizeRequestAuth"),
		enf("spec.jwtRules[].timeout", "TestResolver", "bounds the jwksUri fetch"),
		enf("spec.jwtRules[].presence", "TestIstioRequestAuthentications"),
	},
	"ServiceEntry": {
		enf("spec.hosts[]", "TestServiceEntryCIDRToNode"),
		enf("spec.addresses[]", "TestServiceEntryCIDR", "single addresses and CIDR ranges"),
		enf("spec.ports[]", "TestServiceEntryCIDRToNode"),
		enf("spec.ports[].number", "TestServiceEntryCIDRToNode"),
		enf("spec.ports[].name", "TestGolden"),
		enf("spec.ports[].protocol", "TestWaypointConfigs", "selects HTTP handling at a waypoint; none (or an unknown one) is sniffed there, as Istio does"),
		enf("spec.ports[].targetPort", "TestGolden"),
		enf("spec.location", "TestGolden"),
		enf("spec.resolution", "TestServiceEntryNonePassthrough", "NONE, STATIC and DNS; DNS_ROUND_ROBIN as DNS"),
		enf("spec.endpoints[]", "TestGolden"),
		enf("spec.endpoints[].address", "TestGolden"),
		enf("spec.endpoints[].ports{}", "TestGolden"),
		enf("spec.endpoints[].labels{}", "TestGolden"),
		enf("spec.endpoints[].network", "TestGolden"),
		enf("spec.endpoints[].locality", "TestGolden"),
		enf("spec.endpoints[].weight", "TestGolden"),
		enf("spec.endpoints[].serviceAccount", "TestGolden"),
		enf("spec.workloadSelector", "TestGolden"),
		enf("spec.subjectAltNames[]", "TestGolden"),
		enf("spec.exportTo[]", "TestTenantExportTo", "narrowed further by meshConfig serviceEntryVisibility; an invalid value narrows to the entry's namespace and says so"),
		enf("metadata.labels[istio.io/use-waypoint]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-namespace]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-canary]", "TestWeightedWaypointCanary"),
		enf("metadata.labels[istio.io/use-waypoint-canary-namespace]", "TestWeightedWaypointCanary"),
		enf("metadata.annotations[istio.io/use-waypoint-canary-weight]", "TestWeightedWaypointCanary"),
		na("metadata.labels[istio.io/ingress-use-waypoint]", gatewayOnly),
		enf("metadata.labels[networking.istio.io/enable-autoallocate-ip]", "TestReplicasServeTheSameServiceEntryAddresses"),
		enf("metadata.annotations[networking.istio.io/traffic-distribution]", "TestPodLocality"),
	},
	"WorkloadEntry": {
		enf("spec.address", "TestGolden"),
		enf("spec.ports{}", "TestGolden"),
		enf("spec.labels{}", "TestGolden"),
		enf("spec.network", "TestGolden"),
		enf("spec.locality", "TestGolden"),
		enf("spec.weight", "TestGolden"),
		enf("spec.serviceAccount", "TestGolden"),
		enf("metadata.labels[istio.io/use-waypoint]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-namespace]", "TestWaypointConfigs"),
		na("metadata.labels[service.istio.io/workload-name]", "names the workload in sidecar telemetry; node proxies report the WorkloadEntry's own name"),
		na("metadata.annotations[istio.io/autoRegistrationGroup]", "written by istiod's VM auto-registration, which ztunnel-go does not run"),
		na("metadata.annotations[istio.io/connectedAt]", "written by istiod's VM auto-registration"),
		na("metadata.annotations[istio.io/disconnectedAt]", "written by istiod's VM auto-registration"),
		na("metadata.annotations[istio.io/workloadController]", "written by istiod's VM auto-registration"),
	},
	"VirtualService": {
		enf("spec.hosts[]", "TestWaypointVirtualService"),
		enf("spec.gateways[]", "TestWaypointVirtualServicePrecedence", "only mesh rules apply at a waypoint"),
		enf("spec.exportTo[]", "TestWaypointExportTo", "checked against the waypoint's namespace, with meshConfig defaultVirtualServiceExportTo"),
		enf("spec.http[]", "TestWaypointVirtualService"),
		enf("spec.http[].name", "TestWaypointVirtualService"),
		enf("spec.http[].match[]", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].uri", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].method", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].authority", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].headers{}", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].queryParams{}", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].ignoreUriCase", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].match[].name", "TestWaypointVirtualService"),
		enf("spec.http[].match[].gateways[]", "TestWaypointVirtualServicePrecedence"),
		ref("spec.http[].match[].scheme", "TestWaypointVirtualServiceFailClosed", ruleAnswers500),
		enf("spec.http[].match[].port", "TestAnswer", "the service port the client addressed"),
		ref("spec.http[].match[].sourceLabels{}", "TestWaypointVirtualServiceFailClosed", ruleAnswers500),
		ref("spec.http[].match[].sourceNamespace", "TestWaypointVirtualServiceFailClosed", ruleAnswers500),
		ref("spec.http[].match[].withoutHeaders{}", "TestWaypointVirtualServiceFailClosed", ruleAnswers500),
		na("spec.http[].match[].statPrefix", "names Envoy statistics; the waypoint's metrics are Istio's standard ones"),
		enf("spec.http[].route[]", "TestWaypointVirtualService"),
		enf("spec.http[].route[].destination", "TestVirtualServiceSubsets"),
		enf("spec.http[].route[].weight", "TestWaypointVirtualService"),
		enf("spec.http[].route[].headers", "TestVirtualServiceRedirectRewrite", "request and response headers of requests sent to that destination"),
		enf("spec.http[].redirect", "TestWaypointRedirectRewrite", "uri, prefixRewrite, authority, port, derivePort, scheme, redirectCode (default 301); without port or derivePort the Host's own port is kept, as Envoy does"),
		enf("spec.http[].directResponse", "TestWaypointRedirectRewrite", "status and body (string or bytes, sent as text/plain)"),
		ref("spec.http[].delegate", "TestWaypointVirtualServiceFailClosed", ruleAnswers500),
		enf("spec.http[].rewrite", "TestWaypointRedirectRewrite", "uri replaces the string a prefix match matched (Envoy's prefix_rewrite), else the whole path; uriRegexRewrite replaces every match of its RE2 pattern; authority the Host"),
		enf("spec.http[].corsPolicy", "TestCors", "as Envoy's CORS filter: an allowed preflight is answered 200, other requests from an allowed origin get the CORS response headers; unmatchedPreflights IGNORE answers a preflight from another origin 200 without them, FORWARD (default) sends it upstream"),
		enf("spec.http[].headers", "TestWaypointVirtualService"),
		enf("spec.http[].headers.request", "TestWaypointVirtualService"),
		enf("spec.http[].headers.response", "TestWaypointRedirectRewrite"),
		enf("spec.http[].timeout", "TestWaypointVirtualService"),
		enf("spec.http[].retries", "TestRetryable"),
		enf("spec.http[].fault", "TestWaypointVirtualServiceMatchesAndFault"),
		enf("spec.http[].mirror", "TestMirror"),
		enf("spec.http[].mirrorPercent", "TestMirror"),
		enf("spec.http[].mirrorPercentage", "TestMirror"),
		enf("spec.http[].mirrors[]", "TestMirror"),
		ref("spec.tcp[]", "TestWaypointVirtualServiceFailClosed", "TCP routes are refused: TCP goes to the addressed service and the status names the rule"),
		ref("spec.tls[]", "TestWaypointVirtualServiceFailClosed", "TLS routes are refused: TLS goes to the addressed service and the status names the rule"),
	},
	"DestinationRule": append(append([]Entry{
		enf("spec.host", "TestWaypointDestinationRuleOnly"),
		enf("spec.subsets[]", "TestVirtualServiceSubsets"),
		enf("spec.subsets[].name", "TestVirtualServiceSubsets"),
		enf("spec.subsets[].labels{}", "TestVirtualServiceSubsets"),
		ref("spec.workloadSelector", "TestRefusedFieldsAreRefused", "the DestinationRule applies to no waypoint and its status says so"),
		enf("spec.exportTo[]", "TestWaypointExportTo", "checked against the waypoint's namespace, with meshConfig defaultDestinationRuleExportTo"),
	}, trafficPolicyEntries("spec.trafficPolicy")...), trafficPolicyEntries("spec.subsets[].trafficPolicy")...),
	"Sidecar": {
		ref("spec", "TestIgnoredKinds", notReadKind+"; Sidecar configures sidecar proxies, which ambient pods do not have"),
	},
	"Telemetry": {
		ref("spec", "TestIgnoredKinds", notReadKind),
	},
	"Gateway": {
		enf("spec.gatewayClassName", "TestControllerOnAPIServer", "istio-waypoint makes a waypoint; other classes are not ztunnel-go's"),
		enf("spec.listeners[]", "TestWaypointInboundBinding"),
		enf("spec.listeners[].name", "TestWaypointInboundBinding"),
		enf("spec.listeners[].port", "TestWaypointInboundBinding", "15008 HBONE for a waypoint"),
		enf("spec.listeners[].protocol", "TestWaypointInboundBinding"),
		na("spec.listeners[].hostname", "a waypoint serves every host bound to it; hostname filtering applies to ingress listeners"),
		na("spec.listeners[].tls", "a waypoint's listener is HBONE with mesh mTLS; listener certificates apply to ingress gateways"),
		enf("spec.listeners[].allowedRoutes", "TestCrossNamespaceWaypoint", "which namespaces may bind to the waypoint with istio.io/use-waypoint-namespace, as istiod decides"),
		enf("spec.addresses[]", "TestControllerOnAPIServer", "the Service addresses of the waypoint, written in status"),
		enf("spec.infrastructure", "TestControllerTemplateOnAPIServer", "labels and annotations go onto the waypoint's Deployment and Service"),
		ref("spec.infrastructure.parametersRef", "TestControllerTemplateOnAPIServer", "not read: the Gateway is Programmed=False when it is set"),
		na("spec.allowedListeners", "ListenerSet attachment is for ingress gateways"),
		na("spec.defaultScope", "default-gateway scoping is for ingress gateways"),
		na("spec.tls", "frontend and backend TLS of ingress gateways; a waypoint uses mesh mTLS both ways"),
		enf("metadata.labels[istio.io/waypoint-for]", "TestWaypointInboundBinding"),
		na("metadata.labels[istio.io/rev]", "ztunnel-go runs one control plane revision"),
		enf("metadata.annotations[ambient.istio.io/waypoint-inbound-binding]", "TestWaypointInboundBinding"),
		na("metadata.annotations[gateway.istio.io/name-override]", "the waypoint's Deployment and Service take the Gateway's name"),
		na("metadata.annotations[gateway.istio.io/service-account]", "the waypoint's service account takes the Gateway's name"),
		na("metadata.annotations[networking.istio.io/service-type]", "a waypoint's Service is always ClusterIP"),
	},
	"GatewayClass": {
		enf("spec.controllerName", "TestControllerOnAPIServer"),
		na("spec.description", "documentation only"),
		ref("spec.parametersRef", "TestControllerTemplateOnAPIServer", "not read: Gateways of the class are Programmed=False while it is set"),
		enf("metadata.labels[istio.io/waypoint-for]", "TestWaypointInboundBinding"),
		enf("metadata.annotations[ambient.istio.io/waypoint-inbound-binding]", "TestWaypointInboundBinding"),
	},
	"HTTPRoute": {
		enf("spec.parentRefs[]", "TestWaypointL7", "Services and ServiceEntries; a route parented by a waypoint Gateway applies to everything that waypoint serves"),
		enf("spec.parentRefs[].group", "TestWaypointL7"),
		enf("spec.parentRefs[].kind", "TestWaypointL7"),
		enf("spec.parentRefs[].name", "TestWaypointL7"),
		enf("spec.parentRefs[].namespace", "TestWaypointL7"),
		enf("spec.parentRefs[].port", "TestRouteParentPort", "a port the parent lacks: NoMatchingParent"),
		enf("spec.parentRefs[].sectionName", "TestRouteParentPort", "the parent Service's port name"),
		na("spec.hostnames[]", "a mesh route matches the traffic of its parent Service whatever Host it carries (GAMMA)"),
		na("spec.useDefaultGateways", "default gateways are ingress gateways"),
		enf("spec.rules[]", "TestWaypointL7"),
		enf("spec.rules[].name", "TestWaypointL7"),
		enf("spec.rules[].matches[]", "TestWaypointL7"),
		enf("spec.rules[].backendRefs[]", "TestWeightedRouting"),
		enf("spec.rules[].backendRefs[].filters[]", "TestEditRequest", "RequestHeaderModifier and ResponseHeaderModifier, for requests sent to that backend; a rule with any other backendRef filter answers 500 (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].requestMirror", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].extensionRef", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].cors", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].externalAuth", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].requestRedirect", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].urlRewrite", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		enf("spec.rules[].filters[]", "TestWaypointL7", "RequestHeaderModifier, ResponseHeaderModifier, RequestMirror, RequestRedirect, URLRewrite and CORS; a rule with any other filter answers 500"),
		enf("spec.rules[].filters[].requestRedirect", "TestWaypointRedirectRewrite", "scheme, hostname, port (unset: the scheme's well-known port, else the service port addressed; 80 for http and 443 for https are left out of Location), path, statusCode"),
		enf("spec.rules[].filters[].urlRewrite", "TestWaypointRedirectRewrite", "hostname and path; ReplacePrefixMatch with a match that is not a PathPrefix answers 500 (Accepted=False UnsupportedValue)"),
		enf("spec.rules[].filters[].responseHeaderModifier", "TestWaypointRedirectRewrite"),
		ref("spec.rules[].filters[].extensionRef", "TestWaypointL7", ruleAnswers500),
		enf("spec.rules[].filters[].cors", "TestCors", "an allowed preflight is answered 200 (a preflight from another origin too, without CORS headers); \"*\" with allowCredentials echoes the request; maxAge defaults to 5"),
		ref("spec.rules[].filters[].externalAuth", "TestWaypointL7", ruleAnswers500),
		enf("spec.rules[].timeouts", "TestWaypointL7"),
		enf("spec.rules[].timeouts.backendRequest", "TestRouteRuleFields", "the waypoint's per-try timeout: each request to a backend, every retry included"),
		enf("spec.rules[].retry", "TestWaypointL7"),
		ref("spec.rules[].retry.backoff", "TestRouteRuleFields", "the waypoint does not wait between attempts: "+ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].sessionPersistence", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
	},
	"GRPCRoute": {
		enf("spec.parentRefs[]", "TestWaypointGRPCRoutes"),
		enf("spec.parentRefs[].port", "TestRouteParentPort", "as HTTPRoute's"),
		enf("spec.parentRefs[].sectionName", "TestRouteParentPort", "as HTTPRoute's"),
		na("spec.hostnames[]", "a mesh route matches the traffic of its parent Service whatever Host it carries (GAMMA)"),
		na("spec.useDefaultGateways", "default gateways are ingress gateways"),
		enf("spec.rules[]", "TestWaypointGRPCRoutes"),
		enf("spec.rules[].name", "TestWaypointGRPCRoutes"),
		enf("spec.rules[].matches[]", "TestWaypointGRPCRoutes"),
		enf("spec.rules[].backendRefs[]", "TestWaypointGRPCRoutes"),
		enf("spec.rules[].backendRefs[].filters[]", "TestEditRequest", "RequestHeaderModifier and ResponseHeaderModifier, for requests sent to that backend; a rule with any other backendRef filter answers 500 (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].requestMirror", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		ref("spec.rules[].backendRefs[].filters[].extensionRef", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
		enf("spec.rules[].filters[]", "TestWaypointGRPCRoutes", "RequestHeaderModifier and ResponseHeaderModifier; a rule with any other filter answers 500"),
		enf("spec.rules[].filters[].responseHeaderModifier", "TestEditResponse"),
		ref("spec.rules[].filters[].requestMirror", "TestWaypointGRPCRoutes", ruleAnswers500),
		ref("spec.rules[].filters[].extensionRef", "TestWaypointGRPCRoutes", ruleAnswers500),
		ref("spec.rules[].sessionPersistence", "TestRouteRuleFields", ruleAnswers500+" (Accepted=False UnsupportedValue)"),
	},
	"ReferenceGrant": {
		enf("spec", "TestReferenceGrantBackend", "a cross-namespace backendRef or mirror of an HTTPRoute or GRPCRoute needs a grant in the target namespace; without one ResolvedRefs=False RefNotPermitted and its share answers 500"),
	},
	"Service": {
		enf("spec.selector{}", "TestGolden"),
		enf("spec.ports[]", "TestGolden"),
		enf("spec.ports[].port", "TestGolden"),
		enf("spec.ports[].targetPort", "TestGolden", "numbers, and names resolved per pod from its container ports"),
		enf("spec.ports[].name", "TestWaypointProtocolSniffing", "the protocol prefix (http-, grpc-, tcp-, mysql-, ...) selects HTTP or TCP handling at a waypoint; a port without one is sniffed (HTTP/1.x, h2c, else TCP after 5s)"),
		enf("spec.ports[].appProtocol", "TestWaypointConfigs", "before the port name, as Istio reads it"),
		enf("spec.ports[].protocol", "TestGolden", "TCP only: UDP and SCTP ports are left out of the mesh service"),
		na("spec.ports[].nodePort", lbService),
		enf("spec.clusterIP", "TestGolden"),
		enf("spec.clusterIPs[]", "TestGolden"),
		enf("spec.ipFamilies[]", "TestGolden"),
		na("spec.ipFamilyPolicy", "the addresses themselves (clusterIPs) are read"),
		enf("spec.type", "TestGolden", "ExternalName as an alias where enabled; the other types by their ClusterIP"),
		enf("spec.externalName", "TestGolden"),
		na("spec.externalIPs[]", lbService),
		na("spec.externalTrafficPolicy", lbService),
		na("spec.healthCheckNodePort", lbService),
		na("spec.loadBalancerIP", lbService),
		na("spec.loadBalancerClass", lbService),
		na("spec.loadBalancerSourceRanges[]", lbService),
		na("spec.allocateLoadBalancerNodePorts", lbService),
		enf("spec.internalTrafficPolicy", "TestGolden", "Local keeps traffic on the client's node"),
		enf("spec.publishNotReadyAddresses", "TestGolden"),
		enf("spec.trafficDistribution", "TestPodLocality"),
		ref("spec.sessionAffinity", "TestGolden", "not read: connections are balanced without client-IP affinity"),
		ref("spec.sessionAffinityConfig", "TestGolden", "not read, as sessionAffinity"),
		enf("metadata.labels[istio.io/use-waypoint]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-namespace]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-canary]", "TestWeightedWaypointCanary"),
		enf("metadata.labels[istio.io/use-waypoint-canary-namespace]", "TestWeightedWaypointCanary"),
		enf("metadata.annotations[istio.io/use-waypoint-canary-weight]", "TestWeightedWaypointCanary"),
		na("metadata.labels[istio.io/ingress-use-waypoint]", gatewayOnly),
		enf("metadata.labels[topology.istio.io/network]", "TestGolden"),
		enf("metadata.labels[gateway.istio.io/managed]", "TestWaypointConfigs", "marks a waypoint's own Service"),
		na("metadata.labels[gateway.networking.k8s.io/gateway-class-name]", "written by ztunnel-go's waypoint controller; not read back"),
		na("metadata.labels[gateway.networking.k8s.io/gateway-name]", "written by ztunnel-go's waypoint controller; not read back"),
		na("metadata.labels[networking.istio.io/gatewayPort]", gatewayOnly),
		enf("metadata.annotations[networking.istio.io/exportTo]", "TestExportTo", "with meshConfig defaultServiceExportTo; hiding a Service takes it out of the mesh, kube-proxy still routes its ClusterIP"),
		enf("metadata.annotations[networking.istio.io/traffic-distribution]", "TestPodLocality"),
		na("metadata.annotations[traffic.istio.io/nodeSelector]", gatewayOnly),
		na("metadata.annotations[alpha.istio.io/canonical-serviceaccounts]", "deprecated; identities come from the workloads' service accounts"),
		na("metadata.annotations[alpha.istio.io/kubernetes-serviceaccounts]", "deprecated; identities come from the workloads' service accounts"),
	},
	"EndpointSlice": {
		enf("addressType", "TestGolden"),
		enf("endpoints[]", "TestGolden", "endpoints without a Pod target are workloads of their own (a selectorless Service)"),
		enf("endpoints[].addresses[]", "TestGolden"),
		enf("endpoints[].conditions", "TestGolden"),
		enf("endpoints[].targetRef", "TestGolden"),
		na("endpoints[].hostname", "DNS names of headless Services are answered by cluster DNS"),
		na("endpoints[].nodeName", "the Pod's own nodeName is read"),
		na("endpoints[].zone", "locality comes from the Pod's node labels"),
		na("endpoints[].hints", "topology hints are kube-proxy's; node proxies use trafficDistribution"),
		na("endpoints[].deprecatedTopology{}", "deprecated; see zone"),
		enf("ports[]", "TestGolden"),
	},
	"Pod": {
		na("spec", k8sRuntime),
		enf("spec.nodeName", "TestGolden"),
		enf("spec.hostNetwork", "TestIsAmbient", "host-network pods are never enrolled"),
		enf("spec.serviceAccountName", "TestGolden", "the workload's SPIFFE identity"),
		enf("spec.serviceAccount", "TestGolden", "deprecated alias of serviceAccountName"),
		enf("spec.containers[].ports[]", "TestGolden", "named targetPorts of Services"),
		enf("metadata.labels[istio.io/dataplane-mode]", "TestIsAmbient"),
		enf("metadata.labels[istio.io/use-waypoint]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-namespace]", "TestWaypointConfigs"),
		na("metadata.labels[istio.io/rev]", "ztunnel-go runs one control plane revision"),
		enf("metadata.labels[service.istio.io/canonical-name]", "TestGolden"),
		enf("metadata.labels[service.istio.io/canonical-revision]", "TestGolden"),
		na("metadata.labels[service.istio.io/workload-name]", "sidecar telemetry; node proxies name the workload by its controller"),
		enf("metadata.labels[topology.istio.io/network]", "TestGolden"),
		na("metadata.labels[topology.istio.io/cluster]", "the cluster id is the control plane's"),
		na("metadata.labels[topology.istio.io/locality]", "locality comes from the node's topology labels"),
		na("metadata.labels[security.istio.io/tlsMode]", sidecarOnly),
		na("metadata.labels[sidecar.istio.io/inject]", sidecarOnly),
		enf("metadata.annotations[ambient.istio.io/redirection]", "TestIsAmbient"),
		enf("metadata.annotations[ambient.istio.io/bypass-inbound-capture]", "TestParseAnnotations"),
		enf("metadata.annotations[ambient.istio.io/dns-capture]", "TestParseAnnotations"),
		enf("metadata.annotations[istio.io/reroute-virtual-interfaces]", "TestParseAnnotations"),
		enf("metadata.annotations[sidecar.istio.io/status]", "TestIsAmbient", "a pod with a sidecar is never enrolled in ambient"),
		na("metadata.annotations[inject.istio.io/templates]", sidecarOnly),
		na("metadata.annotations[istio.io/rev]", "ztunnel-go runs one control plane revision"),
		na("metadata.annotations[prometheus.istio.io/merge-metrics]", sidecarOnly),
		na("metadata.annotations[proxy.istio.io/config]", sidecarOnly),
		na("metadata.annotations[proxy.istio.io/overrides]", sidecarOnly),
		na("metadata.annotations[readiness.status.sidecar.istio.io/applicationPorts]", sidecarOnly),
		na("metadata.annotations[readiness.status.sidecar.istio.io/failureThreshold]", sidecarOnly),
		na("metadata.annotations[readiness.status.sidecar.istio.io/initialDelaySeconds]", sidecarOnly),
		na("metadata.annotations[readiness.status.sidecar.istio.io/periodSeconds]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/agentLogLevel]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/bootstrapOverride]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/componentLogLevel]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/discoveryAddress]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/extraStatTags]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/inject]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/interceptionMode]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/logLevel]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/nativeSidecar]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/proxyCPU]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/proxyCPULimit]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/proxyImage]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/proxyImageType]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/proxyMemory]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/proxyMemoryLimit]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/rewriteAppHTTPProbers]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsCompression]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsEvictionInterval]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsFlushInterval]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsHistogramBins]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsHistogramBuckets]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsInclusionPrefixes]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsInclusionRegexps]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/statsInclusionSuffixes]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/userVolume]", sidecarOnly),
		na("metadata.annotations[sidecar.istio.io/userVolumeMount]", sidecarOnly),
		na("metadata.annotations[status.sidecar.istio.io/port]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/excludeInboundPorts]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/excludeInterfaces]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/excludeOutboundIPRanges]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/excludeOutboundPorts]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/includeInboundPorts]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/includeOutboundIPRanges]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/includeOutboundPorts]", sidecarOnly),
		na("metadata.annotations[traffic.sidecar.istio.io/kubevirtInterfaces]", sidecarOnly),
	},
	"Node": {
		na("spec", k8sRuntime),
		enf("metadata.labels[topology.istio.io/subzone]", "TestPodLocality", "with the node's topology.kubernetes.io region and zone labels"),
	},
	"Namespace": {
		na("spec", "finalizers; not read by the mesh"),
		enf("metadata.labels[istio.io/dataplane-mode]", "TestNamespaceAmbient"),
		enf("metadata.labels[istio.io/use-waypoint]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-namespace]", "TestWaypointConfigs"),
		enf("metadata.labels[istio.io/use-waypoint-canary]", "TestWeightedWaypointCanary"),
		enf("metadata.labels[istio.io/use-waypoint-canary-namespace]", "TestWeightedWaypointCanary"),
		enf("metadata.annotations[istio.io/use-waypoint-canary-weight]", "TestWeightedWaypointCanary"),
		na("metadata.labels[istio.io/ingress-use-waypoint]", gatewayOnly),
		na("metadata.labels[istio.io/rev]", "ztunnel-go runs one control plane revision"),
		enf("metadata.labels[topology.istio.io/network]", "TestGolden"),
		enf("metadata.annotations[networking.istio.io/traffic-distribution]", "TestPodLocality"),
		na("metadata.annotations[topology.istio.io/controlPlaneClusters]", "multicluster control plane selection; ztunnel-go serves one cluster"),
	},
}

// trafficPolicyEntries decides a DestinationRule TrafficPolicy at prefix:
// the top-level one and each subset's mean the same, field for field.
func trafficPolicyEntries(p string) []Entry {
	return []Entry{
		enf(p, "TestWaypointDestinationRuleOnly"),
		enf(p+".loadBalancer", "TestWaypointDestinationRuleOnly", "simple ROUND_ROBIN, RANDOM, LEAST_REQUEST (LEAST_CONN as LEAST_REQUEST)"),
		ref(p+".loadBalancer.consistentHash", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".loadBalancer.localityLbSetting", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".loadBalancer.warmupDurationSecs", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".loadBalancer.warmup", "TestWaypointDestinationRuleOnly", destAnswers500),
		enf(p+".outlierDetection", "TestOutlierEjection"),
		ref(p+".outlierDetection.splitExternalLocalOriginErrors", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".outlierDetection.consecutiveLocalOriginFailures", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".outlierDetection.minHealthPercent", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".outlierDetection.outlierDetectionHttpErrorCodes[]", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".outlierDetection.failurePercentageThreshold", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".connectionPool", "TestWaypointDestinationRuleOnly", destAnswers500),
		enf(p+".portLevelSettings[]", "TestWaypointDestinationRulePortTLS", "port and tls (TLS origination per port)"),
		enf(p+".portLevelSettings[].port", "TestWaypointDestinationRulePortTLS", "number; an entry without one is refused"),
		enf(p+".portLevelSettings[].tls", "TestWaypointDestinationRulePortTLS", "as tls, for that port"),
		ref(p+".portLevelSettings[].loadBalancer", "TestWaypointDestinationRulePortTLS", destAnswers500),
		ref(p+".portLevelSettings[].connectionPool", "TestWaypointDestinationRulePortTLS", destAnswers500),
		ref(p+".portLevelSettings[].outlierDetection", "TestWaypointDestinationRulePortTLS", destAnswers500),
		ref(p+".tunnel", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".proxyProtocol", "TestWaypointDestinationRuleOnly", destAnswers500),
		ref(p+".retryBudget", "TestWaypointDestinationRuleOnly", destAnswers500),
		enf(p+".tls", "TestEgressTLSOrigination", "ISTIO_MUTUAL (HBONE, as always), SIMPLE and MUTUAL (the waypoint originates TLS, HTTP ports); DISABLE is refused and requests to the destination answer 500"),
		enf(p+".tls.mode", "TestEgressTLSOrigination", "SIMPLE, MUTUAL, ISTIO_MUTUAL; DISABLE refused"),
		enf(p+".tls.sni", "TestEgressTLSOrigination", "default: the destination's hostname"),
		enf(p+".tls.subjectAltNames[]", "TestEgressTLSOrigination", "DNS or URI SANs; a server without one fails closed (503)"),
		enf(p+".tls.credentialName", "TestEgressTLSOrigination", "a Secret in the DestinationRule's own namespace only (tls.crt/tls.key/ca.crt or cert/key/cacert)"),
		enf(p+".tls.insecureSkipVerify", "TestWaypointDestinationRuleTLS"),
		ref(p+".tls.clientCertificate", "TestWaypointDestinationRuleTLS", "a file path is not available to the waypoint: "+destAnswers500),
		ref(p+".tls.privateKey", "TestWaypointDestinationRuleTLS", "a file path is not available to the waypoint: "+destAnswers500),
		ref(p+".tls.caCertificates", "TestWaypointDestinationRuleTLS", "a file path is not available to the waypoint: "+destAnswers500),
		ref(p+".tls.caCrl", "TestWaypointDestinationRuleTLS", "a file path is not available to the waypoint: "+destAnswers500),
	}
}
