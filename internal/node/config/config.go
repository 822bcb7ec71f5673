// Package config is the node proxy's configuration: every environment
// variable it honours is a constant here (the names Istio's ztunnel uses), and
// Parse turns an environment into one Config, once, in cmd/. No
// other package reads the environment.
//
// It is not the control plane's or the node agent's configuration; those take
// flags.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/otlp"
)

// Environment variable names (Istio's ztunnel src/config.rs).
const (
	EnvXDSAddress              = "XDS_ADDRESS"
	EnvCAAddress               = "CA_ADDRESS"
	EnvXDSRootCA               = "XDS_ROOT_CA"
	EnvCARootCA                = "CA_ROOT_CA"
	EnvAuthToken               = "AUTH_TOKEN"
	EnvClusterID               = "CLUSTER_ID"
	EnvMetaClusterID           = "ISTIO_META_CLUSTER_ID"
	EnvClusterDomain           = "CLUSTER_DOMAIN"
	EnvNetwork                 = "NETWORK"
	EnvNodeName                = "NODE_NAME"
	EnvPodName                 = "POD_NAME"
	EnvPodNamespace            = "POD_NAMESPACE"
	EnvInstanceIP              = "INSTANCE_IP"
	EnvServiceAccount          = "SERVICE_ACCOUNT"
	EnvTrustDomain             = "TRUST_DOMAIN"
	EnvSecretTTL               = "SECRET_TTL"
	EnvInpodUDS                = "INPOD_UDS"
	EnvInpodPortReuse          = "INPOD_PORT_REUSE"
	EnvPacketMark              = "PACKET_MARK"
	EnvIPv6Enabled             = "IPV6_ENABLED"
	EnvEnableOrigSrc           = "ENABLE_ORIG_SRC"
	EnvPoolMaxStreams          = "POOL_MAX_STREAMS_PER_CONNECTION"
	EnvPoolUnusedRelease       = "POOL_UNUSED_RELEASE_TIMEOUT"
	EnvTerminationGrace        = "TERMINATION_GRACE_PERIOD_SECONDS"
	EnvConnTerminationDeadline = "CONNECTION_TERMINATION_DEADLINE"
	EnvDNSProxy                = "DNS_PROXY"
	EnvAdminAddr               = "ADMIN_ADDR"
	EnvStatsAddr               = "STATS_ADDR"
	EnvReadinessAddr           = "READINESS_ADDR"
	// EnvStatsTLSCert and EnvStatsTLSKey (ours): PEM files; when both are
	// set the stats port serves HTTPS only, re-reading them on change.
	EnvStatsTLSCert = "STATS_TLS_CERT"
	EnvStatsTLSKey  = "STATS_TLS_KEY"
	// EnvMetricsGrace (ours): how long the istio_tcp_* series of a deleted
	// workload are kept (so the last values are scraped) before they are
	// dropped; 0 keeps them for the life of the process.
	EnvMetricsGrace = "METRICS_DELETED_WORKLOAD_GRACE"
	// EnvAdaptiveProcs (ours): run on one P while the proxy uses less than
	// a core and on all of them above it (internal/daemon/procs); default
	// true, and off whenever GOMAXPROCS is set (the operator chose).
	EnvAdaptiveProcs = "ADAPTIVE_PROCS"
	// EnvReleaseStartupCode (ours): once the proxy is ready, give the
	// executable's pages back to the system (daemon.ReleaseStartupCode);
	// default true.
	EnvReleaseStartupCode = "RELEASE_STARTUP_CODE"
	// EnvTracingEndpoint, EnvTracingProtocol and EnvTracingSampling (ours):
	// the OTLP collector (host:port) that gets one span per connection,
	// over "grpc" (default) or "http", sampling this percentage of new
	// traces (default 1, Istio's default sampling); unset endpoint: no
	// spans.
	EnvTracingEndpoint        = "TRACING_ENDPOINT"
	EnvTracingProtocol        = "TRACING_PROTOCOL"
	EnvTracingSampling        = "TRACING_SAMPLING"
	EnvLogLevel               = "LOG_LEVEL"
	EnvRustLog                = "RUST_LOG"
	EnvLogFormat              = "LOG_FORMAT"
	EnvAuthzPolicyInfoLogging = "AUTHZ_POLICY_INFO_LOGGING"
	// EnvPreferredServiceNamespace is spelt PREFERED_ (one R) because that
	// is the name Istio's ztunnel reads; only our Go names are corrected.
	EnvPreferredServiceNamespace = "PREFERED_SERVICE_NAMESPACE"
	EnvXDSHeaderPrefix           = "XDS_HEADER_"
	EnvCAHeaderPrefix            = "CA_HEADER_"
	EnvAltXDSHostname            = "ALT_XDS_HOSTNAME"
	EnvAltCAHostname             = "ALT_CA_HOSTNAME"
	EnvIstioVersion              = "ISTIO_VERSION"
	// EnvCRLPath names the CRL bundle (PEM or DER) the HBONE handshakes
	// check peers against (internal/node/crl); unset: no revocation checks.
	EnvCRLPath = "CRL_PATH"
	// EnvIstioMetaPrefix: every ISTIO_META_<k>=<v> is xDS node metadata k.
	EnvIstioMetaPrefix = "ISTIO_META_"
)

// DefaultAddress is Istio's ztunnel default for XDS_ADDRESS and CA_ADDRESS.
const DefaultAddress = "https://istiod.istio-system.svc:15012"

// RootSystem as XDS_ROOT_CA or CA_ROOT_CA verifies against the system pool.
const RootSystem = "SYSTEM"

// Config is the node proxy's whole configuration. It is built once and passed
// by pointer; nothing mutates it afterwards.
type Config struct {
	// XDSAddress / CAAddress: host:port of the control plane's xDS and CA
	// (XDS_ADDRESS, CA_ADDRESS; "https://host:port" or "host:port", the
	// scheme dropped). CAAddress defaults to XDSAddress's value.
	XDSAddress string
	CAAddress  string
	// XDSHostname / CAHostname: the name the server certificate must carry;
	// ALT_XDS_HOSTNAME / ALT_CA_HOSTNAME, else the host of the address.
	XDSHostname string
	CAHostname  string
	// XDSRootCA / CARootCA verify the servers: a PEM file (reloaded on
	// change), an inline PEM ("-----BEGIN ..."), or RootSystem.
	XDSRootCA string
	CARootCA  string
	AuthToken string // file holding the bearer token (re-read on use)

	ClusterID      string
	ClusterDomain  string
	Network        string
	NodeName       string
	PodName        string
	PodNamespace   string
	InstanceIP     string
	ServiceAccount string
	TrustDomain    string
	SecretTTL      time.Duration

	InpodUDS       string // the node agent's ZDS socket
	InpodPortReuse bool
	PacketMark     uint32
	IPv6Enabled    bool
	EnableOrigSrc  bool
	DNSProxy       bool

	PoolMaxStreamsPerConn int
	PoolUnusedRelease     time.Duration
	DrainDeadline         time.Duration

	AdminAddr     string
	StatsAddr     string
	ReadinessAddr string
	// StatsTLSCert and StatsTLSKey: both or neither.
	StatsTLSCert string
	StatsTLSKey  string
	// MetricsGrace: EnvMetricsGrace, default 5 minutes.
	MetricsGrace time.Duration
	// AdaptiveProcs: EnvAdaptiveProcs, false when GOMAXPROCS is set.
	AdaptiveProcs bool
	// ReleaseStartupCode: EnvReleaseStartupCode.
	ReleaseStartupCode bool
	// TracingEndpoint (host:port, "" for no spans), TracingProtocol and
	// TracingSampling (0 to 100): the connection spans.
	TracingEndpoint string
	TracingProtocol otlp.Protocol
	TracingSampling float64

	// LogLevel: LOG_LEVEL, else the default directive of Istio's RUST_LOG
	// ("info" of "info,hickory=warn"; per-target directives are ignored),
	// else info. The --log-level flag overrides both (cmd/ztunnel).
	LogLevel zapcore.Level
	// LogFormat is "json" or "console" (LOG_FORMAT; Istio's "plain" is
	// console); the --log-format flag overrides it.
	LogFormat              string
	AuthzPolicyInfoLogging bool
	// PreferredServiceNamespace (PREFERED_SERVICE_NAMESPACE) is the
	// namespace whose Service wins when a DNS name matches several.
	PreferredServiceNamespace string

	XDSHeaders map[string]string
	CAHeaders  map[string]string
	// CRLPath (CRL_PATH): the CRL bundle, verified against the mesh trust
	// roots (CARootCA) and reloaded on change; "" means no CRL checks.
	CRLPath string
	// NodeMetadata is the xDS node metadata from ISTIO_META_<k> (k → value);
	// ISTIO_VERSION is always set: ISTIO_META_ISTIO_VERSION, else the
	// ISTIO_VERSION variable, else this binary's version.
	NodeMetadata map[string]string
}

// Lookup reads one variable; os.LookupEnv in production, a map in tests.
type Lookup func(key string) (string, bool)

// Parse builds a Config from env (nil means os.LookupEnv); environ (KEY=value
// entries) supplies the prefixed variables (XDS_HEADER_*, CA_HEADER_*,
// ISTIO_META_*). Every malformed value is reported, naming its variable.
func Parse(env Lookup, environ []string) (*Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	p := parser{env: env}
	var err error
	c := &Config{
		XDSRootCA:      p.str(EnvXDSRootCA, "./var/run/secrets/istio/root-cert.pem"),
		CARootCA:       p.str(EnvCARootCA, "./var/run/secrets/istio/root-cert.pem"),
		AuthToken:      p.str(EnvAuthToken, "./var/run/secrets/tokens/istio-token"),
		ClusterDomain:  p.str(EnvClusterDomain, "cluster.local"),
		Network:        p.str(EnvNetwork, ""),
		NodeName:       p.str(EnvNodeName, ""),
		PodName:        p.str(EnvPodName, ""),
		PodNamespace:   p.str(EnvPodNamespace, ""),
		InstanceIP:     p.str(EnvInstanceIP, ""),
		ServiceAccount: p.str(EnvServiceAccount, "ztunnel"),
		TrustDomain:    p.str(EnvTrustDomain, "cluster.local"),
		SecretTTL:      p.duration(EnvSecretTTL, 24*time.Hour),

		InpodUDS:       p.str(EnvInpodUDS, "/var/run/ztunnel/ztunnel.sock"),
		InpodPortReuse: p.boolean(EnvInpodPortReuse, true),
		PacketMark:     uint32(p.integer(EnvPacketMark, 1337, 1, 1<<31)),
		IPv6Enabled:    p.boolean(EnvIPv6Enabled, true),
		EnableOrigSrc:  p.boolean(EnvEnableOrigSrc, true),
		DNSProxy:       p.boolean(EnvDNSProxy, true),

		PoolMaxStreamsPerConn: p.integer(EnvPoolMaxStreams, 100, 1, 1<<16),
		PoolUnusedRelease:     p.duration(EnvPoolUnusedRelease, 5*time.Minute),

		AdminAddr:          p.str(EnvAdminAddr, "localhost:15000"),
		StatsAddr:          p.str(EnvStatsAddr, "[::]:15020"),
		ReadinessAddr:      p.str(EnvReadinessAddr, "[::]:15021"),
		StatsTLSCert:       p.str(EnvStatsTLSCert, ""),
		StatsTLSKey:        p.str(EnvStatsTLSKey, ""),
		MetricsGrace:       p.duration(EnvMetricsGrace, 5*time.Minute),
		AdaptiveProcs:      p.boolean(EnvAdaptiveProcs, true) && p.str("GOMAXPROCS", "") == "",
		ReleaseStartupCode: p.boolean(EnvReleaseStartupCode, true),

		TracingEndpoint: p.str(EnvTracingEndpoint, ""),
		TracingSampling: p.percentage(EnvTracingSampling, 1),

		AuthzPolicyInfoLogging:    p.boolean(EnvAuthzPolicyInfoLogging, false),
		PreferredServiceNamespace: p.str(EnvPreferredServiceNamespace, ""),
		CRLPath:                   p.str(EnvCRLPath, ""),
	}
	c.ClusterID = p.str(EnvMetaClusterID, "")
	if c.ClusterID == "" {
		c.ClusterID = p.str(EnvClusterID, "Kubernetes")
	}
	rawXDS := p.str(EnvXDSAddress, DefaultAddress)
	c.XDSAddress, c.XDSHostname = p.address(EnvXDSAddress, rawXDS, EnvAltXDSHostname)
	c.CAAddress, c.CAHostname = p.address(EnvCAAddress, p.str(EnvCAAddress, rawXDS), EnvAltCAHostname)
	c.DrainDeadline = drainDeadline(&p)
	c.LogLevel = logLevel(&p)
	format := p.str(EnvLogFormat, daemon.FormatJSON)
	if c.LogFormat, err = daemon.ParseFormat(format); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: %w", EnvLogFormat, format, err))
	}
	if c.InstanceIP != "" {
		if _, err := netip.ParseAddr(c.InstanceIP); err != nil {
			p.errs = append(p.errs, fmt.Errorf("%s=%q: %w", EnvInstanceIP, c.InstanceIP, err))
		}
	}
	c.XDSHeaders = prefixed(environ, EnvXDSHeaderPrefix)
	c.CAHeaders = prefixed(environ, EnvCAHeaderPrefix)
	c.NodeMetadata = prefixed(environ, EnvIstioMetaPrefix)
	if c.NodeMetadata["ISTIO_VERSION"] == "" {
		c.NodeMetadata["ISTIO_VERSION"] = p.str(EnvIstioVersion, daemon.Version())
	}
	if (c.StatsTLSCert == "") != (c.StatsTLSKey == "") {
		p.errs = append(p.errs, fmt.Errorf("%s and %s: set both or neither", EnvStatsTLSCert, EnvStatsTLSKey))
	}
	proto := p.str(EnvTracingProtocol, "")
	if c.TracingProtocol, err = otlp.ParseProtocol(proto); err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: %w", EnvTracingProtocol, proto, err))
	}
	if c.TracingEndpoint != "" {
		if _, _, err := net.SplitHostPort(c.TracingEndpoint); err != nil {
			p.errs = append(p.errs, fmt.Errorf("%s=%q: want host:port: %w", EnvTracingEndpoint, c.TracingEndpoint, err))
		}
	}
	if c.NodeName == "" {
		p.errs = append(p.errs, fmt.Errorf("%s is required", EnvNodeName))
	}
	if err := errors.Join(p.errs...); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

// logLevel reads LOG_LEVEL, else RUST_LOG's default directive, else info.
func logLevel(p *parser) zapcore.Level {
	name, v := EnvLogLevel, p.str(EnvLogLevel, "")
	if v == "" {
		name = EnvRustLog
		for _, d := range strings.Split(p.str(EnvRustLog, ""), ",") {
			if d = strings.TrimSpace(d); d != "" && !strings.Contains(d, "=") {
				v = d
			}
		}
	}
	if v == "" {
		return zapcore.InfoLevel
	}
	if strings.EqualFold(v, "off") { // zap cannot mute fatal
		return zapcore.FatalLevel
	}
	lvl, err := daemon.ParseLevel(v)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: %w", name, v, err))
	}
	return lvl
}

// drainDeadline follows Istio: TERMINATION_GRACE_PERIOD_SECONDS - 5 s
// (- 1 s when ≤ 10 s), or CONNECTION_TERMINATION_DEADLINE, default 5 s.
func drainDeadline(p *parser) time.Duration {
	if _, ok := p.env(EnvConnTerminationDeadline); ok {
		return p.duration(EnvConnTerminationDeadline, 5*time.Second)
	}
	if _, ok := p.env(EnvTerminationGrace); ok {
		g := time.Duration(p.integer(EnvTerminationGrace, 30, 1, 1<<20)) * time.Second
		if g <= 10*time.Second {
			return g - time.Second
		}
		return g - 5*time.Second
	}
	return 5 * time.Second
}

// address parses an XDS_ADDRESS-style value, "https://host:port" or
// "host:port" (https:// without a port means 443), into host:port and the
// name to verify: altEnv's value when set, else the host. Any other scheme
// is refused: the node proxy only speaks TLS to its control plane.
func (p *parser) address(name, v, altEnv string) (hostport, hostname string) {
	rest, isURL := strings.CutPrefix(v, "https://")
	if !isURL && strings.Contains(v, "://") {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want https://host:port or host:port", name, v))
		return "", ""
	}
	rest = strings.TrimSuffix(rest, "/")
	host, port, err := net.SplitHostPort(rest)
	if err != nil && isURL && !strings.Contains(strings.TrimSuffix(strings.TrimPrefix(rest, "["), "]"), ":") {
		host, port, err = strings.Trim(rest, "[]"), "443", nil
	}
	if err == nil && (host == "" || strings.ContainsAny(rest, "/?#@")) {
		err = errors.New("want https://host:port or host:port")
	}
	if err == nil {
		if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 {
			err = fmt.Errorf("port %q out of range", port)
		}
	}
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: %w", name, v, err))
		return "", ""
	}
	return net.JoinHostPort(host, port), p.str(altEnv, host)
}

// prefixed collects PREFIX<k>=<v> variables as k → v.
func prefixed(environ []string, prefix string) map[string]string {
	out := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, prefix) && len(k) > len(prefix) {
			out[strings.TrimPrefix(k, prefix)] = v
		}
	}
	return out
}

type parser struct {
	env  Lookup
	errs []error
}

func (p *parser) str(k, def string) string {
	if v, ok := p.env(k); ok && v != "" {
		return v
	}
	return def
}

func (p *parser) boolean(k string, def bool) bool {
	v, ok := p.env(k)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want true or false", k, v))
		return def
	}
	return b
}

func (p *parser) integer(k string, def, lo, hi int) int {
	v, ok := p.env(k)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want an integer in [%d, %d]", k, v, lo, hi))
		return def
	}
	return n
}

// percentage reads a number from 0 to 100.
func (p *parser) percentage(k string, def float64) float64 {
	v, ok := p.env(k)
	if !ok || v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f >= 0 && f <= 100) {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want a percentage from 0 to 100", k, v))
		return def
	}
	return f
}

// duration accepts Go durations ("30s") and, as Istio does for some
// variables, a bare number of seconds.
func (p *parser) duration(k string, def time.Duration) time.Duration {
	v, ok := p.env(k)
	if !ok || v == "" {
		return def
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		p.errs = append(p.errs, fmt.Errorf("%s=%q: want a duration such as 30s", k, v))
		return def
	}
	return d
}
