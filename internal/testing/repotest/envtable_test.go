package repotest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// istioZtunnelEnv is every environment variable Istio's ztunnel reads, from
// istio/ztunnel src/config.rs, src/xds/client.rs and src/version.rs at
// commit 62d826530e5c (2026-08-20): its name constants and env::var calls.
// "*" marks a prefix.
var istioZtunnelEnv = []string{
	"ALT_CA_HOSTNAME", "ALT_XDS_HOSTNAME", "AUTH_TOKEN", "AUTHZ_POLICY_INFO_LOGGING", "CA_ADDRESS", "CA_HEADER_*",
	"CA_ROOT_CA", "CLUSTER_DOMAIN", "CLUSTER_ID", "COMPLIANCE_POLICY", "CONNECTION_TERMINATION_DEADLINE", "CRL_PATH",
	"ENABLE_ENHANCED_BAGGAGE", "ENABLE_ORIG_SRC", "ENABLE_PROXY", "ENABLE_RESPONSE_BAGGAGE", "FAKE_CA",
	"HTTP2_CONNECTION_WINDOW_SIZE", "HTTP2_FRAME_SIZE", "HTTP2_STREAM_WINDOW_SIZE", "INPOD_PORT_REUSE", "INPOD_UDS",
	"INSTANCE_IP", "IPV6_ENABLED", "ISTIO_META_*", "ISTIO_META_DNS_CAPTURE", "ISTIO_META_DNS_PROXY_ADDR",
	"ISTIO_META_ISTIO_VERSION", "KEEPALIVE_ENABLED", "KEEPALIVE_INTERVAL", "KEEPALIVE_RETRIES", "KEEPALIVE_TIME",
	"KUBERNETES_SERVICE_HOST", "LOCALHOST_APP_TUNNEL", "LOCAL_XDS", "LOCAL_XDS_PATH", "LOG_FORMAT", "NETWORK",
	"NODE_NAME", "PACKET_MARK", "POD_NAME", "POD_NAMESPACE", "POOL_MAX_STREAMS_PER_CONNECTION",
	"POOL_UNUSED_RELEASE_TIMEOUT", "PREFERED_SERVICE_NAMESPACE", "PROXY_CONFIG", "PROXY_MODE", "PROXY_WORKLOAD_INFO",
	"RUST_LOG", "SECRET_TTL", "SERVICE_ACCOUNT", "TERMINATION_GRACE_PERIOD_SECONDS", "TLS12_ENABLED", "TRUST_DOMAIN",
	"UNSTABLE_ENABLE_SOCKS5", "USER_TIMEOUT_ENABLED", "XDS_ADDRESS", "XDS_HEADER_*", "XDS_ON_DEMAND", "XDS_ROOT_CA",
	"ZTUNNEL_CPU_LIMIT", "ZTUNNEL_RESOURCE_CPU_LIMIT", "ZTUNNEL_RESOURCE_CPU_REQUEST", "ZTUNNEL_WORKER_THREADS",
}

// TestEnvTable: the node-proxy environment table of docs/configuration.md names every variable
// Istio's ztunnel reads (honoured or not), and every variable
// internal/node/config reads is either in that table as honoured or in its
// "Ours only" line.
func TestEnvTable(t *testing.T) {
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "## Node proxy environment")
	if start < 0 {
		t.Fatal("docs/configuration.md has no \"## Node proxy environment\" section")
	}
	section := text[start:]
	if end := strings.Index(section[4:], "\n## "); end >= 0 {
		section = section[:end+4]
	}
	honoured, notHonoured, ours := map[string]bool{}, map[string]bool{}, map[string]bool{}
	name := regexp.MustCompile("`([A-Z][A-Z0-9_]*\\*?)`")
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "| `"):
			cells := strings.SplitN(line, "|", 4)
			for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
				if strings.Contains(cells[2], "not honoured") || strings.Contains(cells[2], "not read") {
					notHonoured[m[1]] = true
				} else {
					honoured[m[1]] = true
				}
			}
		case strings.HasPrefix(line, "Ours only:"):
			for _, m := range name.FindAllStringSubmatch(line, -1) {
				ours[m[1]] = true
			}
		}
	}
	for _, v := range istioZtunnelEnv {
		if !honoured[v] && !notHonoured[v] {
			t.Errorf("docs/configuration.md's environment table lacks Istio's %s", v)
		}
	}
	src, err := os.ReadFile(filepath.Join(root, "internal", "node", "config", "config.go"))
	if err != nil {
		t.Fatal(err)
	}
	env := regexp.MustCompile(`\bEnv[A-Za-z0-9]+\s*=\s*"([A-Z][A-Z0-9_]*)"`)
	var read []string
	for _, m := range env.FindAllStringSubmatch(string(src), -1) {
		v := m[1]
		if strings.HasSuffix(v, "_") {
			v += "*"
		}
		read = append(read, v)
	}
	if len(read) < 20 {
		t.Fatalf("found only %d Env constants in internal/node/config: the pattern is stale", len(read))
	}
	for _, v := range read {
		if !honoured[v] && !ours[v] {
			t.Errorf("internal/node/config reads %s, but docs/configuration.md lists it neither as honoured nor under \"Ours only\"", v)
		}
		if notHonoured[v] {
			t.Errorf("docs/configuration.md says %s is not honoured, but internal/node/config reads it", v)
		}
	}
	for v := range ours {
		if slices.Contains(istioZtunnelEnv, v) {
			t.Errorf("%s is Istio's, not ours only", v)
		}
	}
}
