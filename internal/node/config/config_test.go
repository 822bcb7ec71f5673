package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/otlp"
)

func env(m map[string]string) config.Lookup {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaults(t *testing.T) {
	c, err := config.Parse(env(map[string]string{"NODE_NAME": "n1"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.PacketMark != 1337 || c.TrustDomain != "cluster.local" || c.ClusterID != "Kubernetes" ||
		c.InpodUDS != "/var/run/ztunnel/ztunnel.sock" || c.SecretTTL != 24*time.Hour ||
		c.PoolMaxStreamsPerConn != 100 || c.PoolUnusedRelease != 5*time.Minute || c.DrainDeadline != 5*time.Second ||
		c.AdminAddr != "localhost:15000" || !c.InpodPortReuse || !c.DNSProxy {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestValuesAndHeaders(t *testing.T) {
	c, err := config.Parse(env(map[string]string{
		"NODE_NAME": "n1", "XDS_ADDRESS": "cp:15012", "ISTIO_META_CLUSTER_ID": "c2", "CLUSTER_ID": "ignored",
		"PACKET_MARK": "4242", "SECRET_TTL": "3600", "TERMINATION_GRACE_PERIOD_SECONDS": "30", "LOG_LEVEL": "debug",
	}), []string{"XDS_HEADER_x-a=1", "CA_HEADER_x-b=2", "OTHER=3"})
	if err != nil {
		t.Fatal(err)
	}
	if c.CAAddress != "cp:15012" || c.ClusterID != "c2" || c.PacketMark != 4242 || c.SecretTTL != time.Hour ||
		c.DrainDeadline != 25*time.Second || c.LogLevel.String() != "debug" {
		t.Fatalf("values: %+v", c)
	}
	if c.XDSHeaders["x-a"] != "1" || c.CAHeaders["x-b"] != "2" || len(c.XDSHeaders) != 1 {
		t.Fatalf("headers: %v %v", c.XDSHeaders, c.CAHeaders)
	}
}

func TestErrorsNameTheVariable(t *testing.T) {
	_, err := config.Parse(env(map[string]string{
		"PACKET_MARK": "x", "IPV6_ENABLED": "maybe", "SECRET_TTL": "soon", "LOG_LEVEL": "loud", "INSTANCE_IP": "1.2.3",
		"XDS_ADDRESS": "http://cp:15010",
	}), nil)
	if err == nil {
		t.Fatal("bad environment accepted")
	}
	for _, want := range []string{"PACKET_MARK", "IPV6_ENABLED", "SECRET_TTL", "LOG_LEVEL", "INSTANCE_IP", "XDS_ADDRESS=", "NODE_NAME is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %s: %v", want, err)
		}
	}
}

func TestLogLevelAndFormat(t *testing.T) {
	for _, tc := range []struct {
		env    map[string]string
		level  string
		format string
	}{
		{map[string]string{}, "info", "json"},
		{map[string]string{"RUST_LOG": "debug"}, "debug", "json"},
		{map[string]string{"RUST_LOG": "hickory=trace,warn"}, "warn", "json"}, // per-target directives are ignored
		{map[string]string{"RUST_LOG": "trace", "LOG_LEVEL": "error"}, "error", "json"},
		{map[string]string{"LOG_LEVEL": "debug", "LOG_FORMAT": "plain"}, "debug", "console"}, // Istio's name for text logs
		{map[string]string{"LOG_FORMAT": "console"}, "info", "console"},
	} {
		tc.env["NODE_NAME"] = "n1"
		c, err := config.Parse(env(tc.env), nil)
		if err != nil {
			t.Errorf("%v: %v", tc.env, err)
			continue
		}
		if c.LogLevel.String() != tc.level || c.LogFormat != tc.format {
			t.Errorf("%v: level %s format %s, want %s %s", tc.env, c.LogLevel, c.LogFormat, tc.level, tc.format)
		}
	}
	_, err := config.Parse(env(map[string]string{"NODE_NAME": "n1", "RUST_LOG": "chatty", "LOG_FORMAT": "xml"}), nil)
	if err == nil || !strings.Contains(err.Error(), "RUST_LOG") || !strings.Contains(err.Error(), "LOG_FORMAT") {
		t.Errorf("bad RUST_LOG and LOG_FORMAT: %v", err)
	}
}

func TestPreferredServiceNamespace(t *testing.T) {
	// Istio's variable is spelt PREFERED_ (sic); the Go field is not.
	c, err := config.Parse(env(map[string]string{"NODE_NAME": "n1", config.EnvPreferredServiceNamespace: "apps"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if config.EnvPreferredServiceNamespace != "PREFERED_SERVICE_NAMESPACE" || c.PreferredServiceNamespace != "apps" {
		t.Errorf("PREFERED_SERVICE_NAMESPACE=apps gave %q", c.PreferredServiceNamespace)
	}
}

func TestAddresses(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		env                      map[string]string
		xds, xdsHost, ca, caHost string
		wantErr                  string
	}{
		{name: "default is istiod", xds: "istiod.istio-system.svc:15012", xdsHost: "istiod.istio-system.svc",
			ca: "istiod.istio-system.svc:15012", caHost: "istiod.istio-system.svc"},
		{name: "plain host:port", env: map[string]string{"XDS_ADDRESS": "cp.ns.svc:15012"},
			xds: "cp.ns.svc:15012", xdsHost: "cp.ns.svc", ca: "cp.ns.svc:15012", caHost: "cp.ns.svc"},
		{name: "https with port, CA apart", env: map[string]string{"XDS_ADDRESS": "https://cp:15012/", "CA_ADDRESS": "https://ca.x:443"},
			xds: "cp:15012", xdsHost: "cp", ca: "ca.x:443", caHost: "ca.x"},
		{name: "https without port is 443", env: map[string]string{"XDS_ADDRESS": "https://cp.example"},
			xds: "cp.example:443", xdsHost: "cp.example", ca: "cp.example:443", caHost: "cp.example"},
		{name: "ipv6 with alt hostnames", env: map[string]string{"XDS_ADDRESS": "https://[fd00::1]:15012",
			"ALT_XDS_HOSTNAME": "istiod.istio-system.svc", "ALT_CA_HOSTNAME": "ca.internal"},
			xds: "[fd00::1]:15012", xdsHost: "istiod.istio-system.svc", ca: "[fd00::1]:15012", caHost: "ca.internal"},
		{name: "http refused", env: map[string]string{"XDS_ADDRESS": "http://cp:15010"}, wantErr: "XDS_ADDRESS"},
		{name: "no port refused", env: map[string]string{"CA_ADDRESS": "ca.x"}, wantErr: "CA_ADDRESS"},
		{name: "bad port refused", env: map[string]string{"XDS_ADDRESS": "cp:99999"}, wantErr: "XDS_ADDRESS"},
		{name: "path refused", env: map[string]string{"XDS_ADDRESS": "https://cp:15012/x"}, wantErr: "XDS_ADDRESS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{"NODE_NAME": "n1"}
			for k, v := range tc.env {
				m[k] = v
			}
			c, err := config.Parse(env(m), nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.XDSAddress != tc.xds || c.XDSHostname != tc.xdsHost || c.CAAddress != tc.ca || c.CAHostname != tc.caHost {
				t.Fatalf("got xds %s (%s) ca %s (%s), want %s (%s) %s (%s)", c.XDSAddress, c.XDSHostname,
					c.CAAddress, c.CAHostname, tc.xds, tc.xdsHost, tc.ca, tc.caHost)
			}
		})
	}
}

func TestNodeMetadata(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		environ []string
		want    map[string]string
	}{
		{name: "istio version from env", env: map[string]string{"ISTIO_VERSION": "1.24.2"},
			environ: []string{"ISTIO_META_DNS_CAPTURE=true", "ISTIO_META_=x", "OTHER=1"},
			want:    map[string]string{"DNS_CAPTURE": "true", "ISTIO_VERSION": "1.24.2"}},
		{name: "meta istio version wins", env: map[string]string{"ISTIO_VERSION": "1.24.2"},
			environ: []string{"ISTIO_META_ISTIO_VERSION=1.25.0"},
			want:    map[string]string{"ISTIO_VERSION": "1.25.0"}},
		{name: "binary version when unset", want: map[string]string{"ISTIO_VERSION": daemon.Version()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{"NODE_NAME": "n1"}
			for k, v := range tc.env {
				m[k] = v
			}
			c, err := config.Parse(env(m), tc.environ)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.NodeMetadata) != len(tc.want) {
				t.Fatalf("metadata %v, want %v", c.NodeMetadata, tc.want)
			}
			for k, v := range tc.want {
				if c.NodeMetadata[k] != v {
					t.Fatalf("metadata %v, want %v", c.NodeMetadata, tc.want)
				}
			}
		})
	}
}

func TestCRLPath(t *testing.T) {
	c, err := config.Parse(env(map[string]string{"NODE_NAME": "n1"}), nil)
	if err != nil || c.CRLPath != "" {
		t.Fatalf("default CRL_PATH: %q, %v; want unset (no CRL checks)", c.CRLPath, err)
	}
	c, err = config.Parse(env(map[string]string{"NODE_NAME": "n1", config.EnvCRLPath: "/etc/istio/crl/ca-crl.pem"}), nil)
	if err != nil || c.CRLPath != "/etc/istio/crl/ca-crl.pem" {
		t.Fatalf("CRL_PATH: %q, %v", c.CRLPath, err)
	}
}

func TestTracing(t *testing.T) {
	c, err := config.Parse(env(map[string]string{"NODE_NAME": "n1"}), nil)
	if err != nil || c.TracingEndpoint != "" || c.TracingProtocol != otlp.GRPC || c.TracingSampling != 1 {
		t.Fatalf("default tracing: %q %q %v, %v; want off, grpc, 1%%", c.TracingEndpoint, c.TracingProtocol, c.TracingSampling, err)
	}
	c, err = config.Parse(env(map[string]string{"NODE_NAME": "n1", config.EnvTracingEndpoint: "otel.istio-system:4318",
		config.EnvTracingProtocol: "HTTP", config.EnvTracingSampling: "12.5"}), nil)
	if err != nil || c.TracingEndpoint != "otel.istio-system:4318" || c.TracingProtocol != otlp.HTTP || c.TracingSampling != 12.5 {
		t.Fatalf("tracing: %q %q %v, %v", c.TracingEndpoint, c.TracingProtocol, c.TracingSampling, err)
	}
	_, err = config.Parse(env(map[string]string{"NODE_NAME": "n1", config.EnvTracingEndpoint: "otel",
		config.EnvTracingProtocol: "zipkin", config.EnvTracingSampling: "101"}), nil)
	for _, want := range []string{config.EnvTracingEndpoint, config.EnvTracingProtocol, config.EnvTracingSampling} {
		if err == nil || !strings.Contains(err.Error(), want+"=") {
			t.Errorf("error lacks %s: %v", want, err)
		}
	}
}
