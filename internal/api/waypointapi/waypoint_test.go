package waypointapi

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/apitest"
)

// contract pins every field number and enum value: a waypoint and a control
// plane of different versions must agree on them.
var contract = apitest.Contract{
	Package: "ztunnelgo.waypoint",
	Messages: map[string]map[string]protoreflect.FieldNumber{
		"Config": {
			"name": 1, "namespace": 2, "identity": 3, "addresses": 4, "traffic_type": 5,
			"services": 6, "workloads": 7, "policies": 8, "authentications": 9, "path_normalization": 10,
			"telemetry": 20,
		},
		"Telemetry":         {"sources": 1, "access_logging": 2, "metric_overrides": 3, "tracing": 4},
		"AccessLogging":     {"providers": 1, "filter": 2, "filter_expression": 3},
		"LogCondition":      {"attribute": 1, "header": 2, "op": 3, "value": 4},
		"AccessLogProvider": {"name": 1, "file": 2, "otel": 3},
		"LogFormat":         {"text": 1, "labels": 2},
		"FileAccessLog":     {"path": 1, "format": 2},
		"OtelAccessLog":     {"service": 1, "port": 2, "log_name": 3, "format": 4},
		"MetricOverride":    {"metric": 1, "disabled": 2, "tags": 3},
		"TagOverride":       {"name": 1, "remove": 2, "value": 3},
		"TagValue":          {"expression": 1, "attribute": 2, "header": 3, "literal": 4},
		"Tracing": {
			"provider": 1, "random_sampling_percentage": 2, "disable_span_reporting": 3, "custom_tags": 4,
			"service_name": 5, "use_request_id_for_trace_sampling": 6,
		},
		"TracingProvider": {
			"name": 1, "service": 2, "port": 3, "protocol": 4, "http_path": 5, "headers": 6, "max_tag_length": 7, "timeout_ms": 8,
		},
		"CustomTag":    {"name": 1, "literal": 2, "header": 3, "environment": 4, "default_value": 5},
		"RequestAuthn": {"name": 1, "namespace": 2, "services": 3, "rules": 4, "target": 5},
		"JwtRule": {
			"issuer": 1, "audiences": 2, "jwks": 3, "from_headers": 4, "from_params": 5,
			"forward_original_token": 6, "output_claim_to_headers": 7, "error": 8,
		},
		"JwtHeader":     {"name": 1, "prefix": 2},
		"ClaimToHeader": {"header": 1, "claim": 2},
		"Service":       {"name": 1, "namespace": 2, "hostname": 3, "addresses": 4, "ports": 5, "routes": 6, "kind": 7, "telemetry": 20},
		"Port":          {"port": 1, "name": 2, "protocol": 3},
		"Workload":      {"uid": 1, "name": 2, "namespace": 3, "addresses": 4},
		"Policy": {
			"name": 1, "namespace": 2, "action": 3, "dry_run": 4, "rules": 5, "services": 6, "target": 7,
		},
		"Rule": {"from": 1, "to": 2, "when": 3},
		"Source": {
			"principals": 1, "not_principals": 2, "namespaces": 3, "not_namespaces": 4,
			"ip_blocks": 5, "not_ip_blocks": 6, "remote_ip_blocks": 7, "not_remote_ip_blocks": 8,
			"request_principals": 9, "not_request_principals": 10,
			"service_accounts": 11, "not_service_accounts": 12, "trust_domains": 13, "not_trust_domains": 14,
		},
		"ServiceAccount": {"namespace": 1, "name": 2},
		"Operation": {
			"hosts": 1, "not_hosts": 2, "ports": 3, "not_ports": 4,
			"methods": 5, "not_methods": 6, "paths": 7, "not_paths": 8,
		},
		"Condition":   {"key": 1, "values": 2, "not_values": 3},
		"Cidr":        {"address": 1, "length": 2},
		"StringMatch": {"exact": 1, "prefix": 2, "suffix": 3, "presence": 4},
		"Route":       {"name": 1, "namespace": 2, "rules": 3, "kind": 4, "ports": 5, "client_namespace": 6},
		"RouteRule": {
			"matches": 1, "request_header_modifiers": 2, "backends": 3, "timeout_ms": 4, "retry": 5, "mirrors": 6, "fault": 7,
			"response_header_modifiers": 8, "rewrite": 9, "redirect": 10, "direct_response": 11, "cors": 12,
		},
		"Cors": {
			"allow_origins": 1, "allow_methods": 2, "allow_headers": 3, "expose_headers": 4, "max_age_s": 5,
			"allow_credentials": 6, "unmatched_preflight": 7,
		},
		"PathModifier":    {"type": 1, "value": 2, "pattern": 3},
		"Rewrite":         {"path": 1, "host": 2},
		"Redirect":        {"scheme": 1, "host": 2, "port": 3, "path": 4, "code": 5, "port_rule": 6},
		"DirectResponse":  {"status": 1, "body": 2},
		"Fault":           {"delay_ms": 1, "delay_percent": 2, "abort_status": 3, "abort_percent": 4},
		"Mirror":          {"backend": 1, "percent": 2},
		"RouteMatch":      {"path": 1, "headers": 2, "method": 3, "query_params": 4, "port": 5, "source_namespace": 6, "source_workloads": 7},
		"SourceWorkloads": {"labels": 1, "uids": 2},
		"PathMatch":       {"type": 1, "value": 2, "ignore_case": 3},
		"HeaderMatch":     {"name": 1, "value": 2, "regex": 3},
		"HeaderModifier":  {"set": 1, "add": 2, "remove": 3},
		"Backend": {
			"hostname": 1, "namespace": 2, "port": 3, "weight": 4, "subset": 5, "subset_labels": 6,
			"missing_subset": 7, "traffic_policy": 8, "subset_workloads": 9, "refused": 10,
			"request_header_modifiers": 11, "response_header_modifiers": 12,
		},
		"TrafficPolicy": {
			"load_balancer": 1, "outlier_detection": 2, "connection_pool": 3, "consistent_hash": 4, "locality": 5,
			"port_policies": 6, "tls": 20,
		},
		"ConnectionPool": {
			"max_connections": 1, "connect_timeout_ms": 2, "max_pending_requests": 3, "max_requests": 4,
			"max_requests_per_connection": 5, "max_retries": 6, "idle_timeout_ms": 7,
		},
		"ConsistentHash": {
			"key": 1, "name": 2, "cookie_path": 3, "cookie_ttl_set": 4, "cookie_ttl_ms": 5, "maglev": 6, "table_size": 7,
		},
		"LocalityLb":         {"distribute": 1, "failover": 2, "failover_priority": 3},
		"LocalityDistribute": {"from": 1, "to": 2},
		"LocalityFailover":   {"from": 1, "to": 2},
		"ClientTLS": {
			"mutual": 1, "sni": 2, "subject_alt_names": 3, "ca_certificates": 4, "insecure_skip_verify": 5,
			"cert_chain": 6, "private_key": 7, "credential": 8,
		},
		"OutlierDetection": {
			"consecutive_server_errors": 1, "consecutive_gateway_errors": 2, "interval_ms": 3,
			"base_ejection_time_ms": 4, "max_ejection_percent": 5,
		},
		"Retry": {"attempts": 1, "per_try_timeout_ms": 2, "codes": 3},
	},
	Enums: map[string]map[string]protoreflect.EnumNumber{
		"Protocol":           {"TCP": 0, "HTTP": 1, "HTTP2": 2, "AUTO": 3},
		"Action":             {"ALLOW": 0, "DENY": 1, "AUDIT": 2},
		"PathMatch.Type":     {"PATH_PREFIX": 0, "EXACT": 1, "REGULAR_EXPRESSION": 2, "STRING_PREFIX": 3},
		"Cors.Unmatched":     {"FORWARD": 0, "ANSWER": 1},
		"PathModifier.Type":  {"FULL": 0, "PREFIX": 1, "STRING_PREFIX": 2, "REGEX": 3},
		"Redirect.PortRule":  {"GATEWAY": 0, "KEEP": 1, "PROTOCOL_DEFAULT": 2, "REQUEST_PORT": 3},
		"LoadBalancer":       {"LB_DEFAULT": 0, "ROUND_ROBIN": 1, "RANDOM": 2, "LEAST_REQUEST": 3},
		"ConsistentHash.Key": {"HEADER": 0, "COOKIE": 1, "SOURCE_IP": 2, "QUERY_PARAMETER": 3},
		"PathNormalization": {
			"PATH_NORMALIZATION_DEFAULT": 0, "PATH_NORMALIZATION_NONE": 1, "PATH_NORMALIZATION_BASE": 2,
			"PATH_NORMALIZATION_MERGE_SLASHES": 3, "PATH_NORMALIZATION_DECODE_AND_MERGE_SLASHES": 4,
		},
		"Attribute": {
			"ATTRIBUTE_UNSPECIFIED": 0, "REQUEST_HEADER": 1, "REQUEST_HOST": 2, "REQUEST_METHOD": 3, "REQUEST_PATH": 4,
			"REQUEST_URL_PATH": 5, "REQUEST_SCHEME": 6, "REQUEST_PROTOCOL": 7, "RESPONSE_CODE": 8, "RESPONSE_DURATION_MS": 9,
		},
		"LogCondition.Op": {"EQ": 0, "NE": 1, "LT": 2, "LE": 3, "GT": 4, "GE": 5},
		"Metric": {
			"ALL_METRICS": 0, "REQUEST_COUNT": 1, "REQUEST_DURATION": 2, "REQUEST_SIZE": 3, "RESPONSE_SIZE": 4,
			"TCP_OPENED_CONNECTIONS": 5, "TCP_CLOSED_CONNECTIONS": 6, "TCP_SENT_BYTES": 7, "TCP_RECEIVED_BYTES": 8,
			"GRPC_REQUEST_MESSAGES": 9, "GRPC_RESPONSE_MESSAGES": 10,
		},
		"TracingProvider.Protocol": {"GRPC": 0, "HTTP": 1},
	},
}

func TestWireContract(t *testing.T) {
	apitest.CheckContract(t, File_waypointapi_waypoint_proto, contract)
}

func sm(s string) *StringMatch { return &StringMatch{MatchType: &StringMatch_Exact{Exact: s}} }

func fullConfig() *Config {
	ip := []byte{10, 0, 0, 1}
	return &Config{
		Name: "waypoint", Namespace: "default", Identity: "spiffe://cluster.local/ns/default/sa/waypoint",
		Addresses: [][]byte{ip}, TrafficType: "service", PathNormalization: PathNormalization_PATH_NORMALIZATION_MERGE_SLASHES,
		Services: []*Service{{
			Name: "reviews", Namespace: "default", Hostname: "reviews.default.svc.cluster.local", Kind: "Service",
			Addresses: [][]byte{ip}, Ports: []*Port{{Port: 80, Name: "http", Protocol: Protocol_HTTP}},
			Routes:    []*Route{{Name: "r", Namespace: "default", Kind: "HTTPRoute", Rules: []*RouteRule{fullRouteRule()}}},
			Telemetry: &Telemetry{Sources: []string{"default/reviews"}},
		}},
		Workloads: []*Workload{{Uid: "u", Name: "n", Namespace: "default", Addresses: [][]byte{ip}}},
		Policies: []*Policy{{
			Name: "p", Namespace: "default", Action: Action_AUDIT, DryRun: true, Services: []string{"h"},
			Target: "Gateway default/waypoint", Rules: []*Rule{fullRule()},
		}},
		Authentications: []*RequestAuthn{{
			Name: "jwt", Namespace: "default", Services: []string{"h"}, Target: "Service default/reviews",
			Rules: []*JwtRule{{
				Issuer: "iss", Audiences: []string{"aud"}, Jwks: `{"keys":[]}`,
				FromHeaders: []*JwtHeader{{Name: "x-jwt", Prefix: "Bearer "}}, FromParams: []string{"token"},
				ForwardOriginalToken: true, OutputClaimToHeaders: []*ClaimToHeader{{Header: "x-sub", Claim: "sub"}},
				Error: "jwksUri is not fetched",
			}},
		}},
		Telemetry: fullTelemetry(),
	}
}

func fullTelemetry() *Telemetry {
	format := &LogFormat{Text: "%REQ(:METHOD)%\n", Labels: map[string]string{"code": "%RESPONSE_CODE%"}}
	return &Telemetry{
		Sources: []string{"istio-system/mesh-default", "default/wp"},
		AccessLogging: &AccessLogging{
			Providers: []*AccessLogProvider{
				{Name: "stdout", Kind: &AccessLogProvider_File{File: &FileAccessLog{Path: "/dev/stdout", Format: format}}},
				{Name: "otel", Kind: &AccessLogProvider_Otel{Otel: &OtelAccessLog{
					Service: "otel.istio-system.svc.cluster.local", Port: 4317, LogName: "otel_envoy_accesslog", Format: format,
				}}},
			},
			Filter:           []*LogCondition{{Attribute: Attribute_REQUEST_HEADER, Header: "x-debug", Op: LogCondition_GE, Value: "400"}},
			FilterExpression: "response.code >= 400",
		},
		MetricOverrides: []*MetricOverride{{
			Metric: Metric_REQUEST_COUNT, Disabled: true,
			Tags: []*TagOverride{{Name: "request_host", Remove: true, Value: &TagValue{
				Expression: "request.headers['x-a']", Attribute: Attribute_REQUEST_HEADER, Header: "x-a", Literal: "l",
			}}},
		}},
		Tracing: &Tracing{
			Provider: &TracingProvider{
				Name: "otel-tracing", Service: "otel.istio-system.svc.cluster.local", Port: 4318, Protocol: TracingProvider_HTTP,
				HttpPath: "/v1/traces", Headers: map[string]string{"a": "b"}, MaxTagLength: 256, TimeoutMs: 1000,
			},
			RandomSamplingPercentage: 12.5, DisableSpanReporting: true, ServiceName: "waypoint.default",
			UseRequestIdForTraceSampling: true,
			CustomTags: []*CustomTag{
				{Name: "lit", Type: &CustomTag_Literal{Literal: "v"}},
				{Name: "hdr", Type: &CustomTag_Header{Header: "x-h"}, DefaultValue: "none"},
				{Name: "env", Type: &CustomTag_Environment{Environment: "POD_NAME"}},
			},
		},
	}
}

func fullRule() *Rule {
	cidr := []*Cidr{{Address: []byte{10, 0, 0, 0}, Length: 8}}
	return &Rule{
		From: []*Source{{
			Principals: []*StringMatch{sm("a")}, NotPrincipals: []*StringMatch{sm("b")},
			Namespaces: []*StringMatch{sm("c")}, NotNamespaces: []*StringMatch{sm("d")},
			IpBlocks: cidr, NotIpBlocks: cidr, RemoteIpBlocks: cidr, NotRemoteIpBlocks: cidr,
			RequestPrincipals: []*StringMatch{sm("iss/sub")}, NotRequestPrincipals: []*StringMatch{sm("iss/bad")},
			ServiceAccounts: []*ServiceAccount{{Namespace: "ns", Name: "sa"}}, NotServiceAccounts: []*ServiceAccount{{Namespace: "ns", Name: "x"}},
			TrustDomains: []*StringMatch{sm("td")}, NotTrustDomains: []*StringMatch{sm("other")},
		}},
		To: []*Operation{{
			Hosts: []*StringMatch{sm("h")}, NotHosts: []*StringMatch{sm("i")}, Ports: []uint32{80}, NotPorts: []uint32{81},
			Methods: []*StringMatch{sm("GET")}, NotMethods: []*StringMatch{sm("PUT")},
			Paths: []*StringMatch{{MatchType: &StringMatch_Prefix{Prefix: "/a"}}}, NotPaths: []*StringMatch{sm("/b")},
		}},
		When: []*Condition{{Key: "request.headers[x]", Values: []*StringMatch{sm("1")}, NotValues: []*StringMatch{sm("2")}}},
	}
}

func fullRouteRule() *RouteRule {
	return &RouteRule{
		Matches: []*RouteMatch{{
			Path:    &PathMatch{Type: PathMatch_EXACT, Value: "/x", IgnoreCase: true},
			Headers: []*HeaderMatch{{Name: "h", Value: "v", Regex: true}}, Method: "GET",
			QueryParams: []*HeaderMatch{{Name: "q", Value: "1"}}, Port: 8080, SourceNamespace: "shop",
			SourceWorkloads: &SourceWorkloads{Labels: map[string]string{"app": "client"}, Uids: []string{"uid-2"}},
		}},
		RequestHeaderModifiers: []*HeaderModifier{{Set: map[string]string{"a": "1"}, Add: map[string]string{"b": "2"}, Remove: []string{"c"}}},
		Backends: []*Backend{{
			Hostname: "h", Namespace: "default", Port: 80, Weight: 90, Subset: "v1",
			SubsetLabels: map[string]string{"version": "v1"}, MissingSubset: true, SubsetWorkloads: []string{"uid-1"},
			Refused:                 "no ReferenceGrant",
			RequestHeaderModifiers:  []*HeaderModifier{{Set: map[string]string{"d": "4"}}},
			ResponseHeaderModifiers: []*HeaderModifier{{Remove: []string{"e"}}},
			TrafficPolicy: &TrafficPolicy{
				LoadBalancer: LoadBalancer_LEAST_REQUEST,
				OutlierDetection: &OutlierDetection{
					ConsecutiveServerErrors: 5, ConsecutiveGatewayErrors: 3, IntervalMs: 1000, BaseEjectionTimeMs: 30000, MaxEjectionPercent: 50,
				},
				ConnectionPool: &ConnectionPool{MaxConnections: 1, ConnectTimeoutMs: 2, MaxPendingRequests: 3, MaxRequests: 4,
					MaxRequestsPerConnection: 5, MaxRetries: 6, IdleTimeoutMs: 7},
				ConsistentHash: &ConsistentHash{Key: ConsistentHash_COOKIE, Name: "c", CookiePath: "/", CookieTtlSet: true,
					CookieTtlMs: 1000, Maglev: true, TableSize: 65537},
				Locality: &LocalityLb{
					Distribute:       []*LocalityDistribute{{From: "a/b/*", To: map[string]uint32{"a/*": 80, "c/*": 20}}},
					Failover:         []*LocalityFailover{{From: "a", To: "c"}},
					FailoverPriority: []string{"topology.kubernetes.io/region"},
				},
				PortPolicies: map[uint32]*TrafficPolicy{9080: {LoadBalancer: LoadBalancer_RANDOM}},
				Tls: &ClientTLS{
					Mutual: true, Sni: "api.example.com", SubjectAltNames: []string{"api.example.com"}, CaCertificates: []byte("ca"),
					InsecureSkipVerify: true, CertChain: []byte("crt"), PrivateKey: []byte("key"), Credential: "egress/client",
				},
			},
		}},
		TimeoutMs: 1000,
		Retry:     &Retry{Attempts: 2, PerTryTimeoutMs: 100, Codes: []uint32{503}},
		Mirrors:   []*Mirror{{Backend: &Backend{Hostname: "m", Namespace: "default", Port: 80, Weight: 1}, Percent: 25}},
		Fault:     &Fault{DelayMs: 100, DelayPercent: 10, AbortStatus: 503, AbortPercent: 5.5},

		ResponseHeaderModifiers: []*HeaderModifier{{Add: map[string]string{"x": "y"}}},
		Rewrite:                 &Rewrite{Path: &PathModifier{Type: PathModifier_REGEX, Value: "/v2/\\1", Pattern: "^/v1/(.*)"}, Host: "h2"},
		Redirect: &Redirect{
			Scheme: "https", Host: "h3", Port: 8443, Path: &PathModifier{Type: PathModifier_PREFIX, Value: "/new"},
			Code: 308, PortRule: Redirect_REQUEST_PORT,
		},
		DirectResponse: &DirectResponse{Status: 418, Body: []byte("teapot")},
		Cors: &Cors{
			AllowOrigins: []string{"https://a"}, AllowMethods: []string{"GET"}, AllowHeaders: []string{"x-a"},
			ExposeHeaders: []string{"x-b"}, MaxAgeS: 60, AllowCredentials: true, UnmatchedPreflight: Cors_ANSWER,
		},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, m := range []interface{ ProtoReflect() protoreflect.Message }{fullConfig(), fullRule(), fullRouteRule(), fullTelemetry()} {
		apitest.CheckPopulated(t, m)
		apitest.RoundTrip(t, m)
	}
}

// TestWireNumbers checks the encoding of a few fields byte-wise, so a
// renumbering cannot pass by agreeing with itself.
func TestWireNumbers(t *testing.T) {
	b := apitest.RoundTrip(t, &Config{Name: "n", Addresses: [][]byte{{1, 2, 3, 4}}, Policies: []*Policy{{Action: Action_DENY}}})
	apitest.WantOnWire(t, b, map[protowire.Number]protowire.Type{1: protowire.BytesType, 4: protowire.BytesType, 8: protowire.BytesType})
	pb := apitest.RoundTrip(t, &Policy{Action: Action_AUDIT, DryRun: true})
	apitest.WantOnWire(t, pb, map[protowire.Number]protowire.Type{3: protowire.VarintType, 4: protowire.VarintType})
	ob := apitest.RoundTrip(t, &Operation{Ports: []uint32{80, 443}})
	apitest.WantOnWire(t, ob, map[protowire.Number]protowire.Type{3: protowire.BytesType}) // packed
	tb := apitest.RoundTrip(t, &Config{Telemetry: &Telemetry{Sources: []string{"a/b"}}})
	apitest.WantOnWire(t, tb, map[protowire.Number]protowire.Type{20: protowire.BytesType})
	trb := apitest.RoundTrip(t, &Tracing{RandomSamplingPercentage: 50, DisableSpanReporting: true})
	apitest.WantOnWire(t, trb, map[protowire.Number]protowire.Type{2: protowire.Fixed64Type, 3: protowire.VarintType})
}
