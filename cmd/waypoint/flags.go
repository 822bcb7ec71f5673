package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Modes of the binary (--mode): Istio runs one proxy image for both.
const (
	modeWaypoint = "waypoint"
	modeEastWest = "east-west"
)

type options struct {
	Gateway string `json:"gateway"` // namespace/name
	// Mode is modeWaypoint (an istio-waypoint Gateway) or modeEastWest
	// (an istio-east-west Gateway: proxy/eastwest).
	Mode string `json:"mode"`
	// Network is the east-west gateway's network (the Gateway's
	// topology.istio.io/network label): the only one it forwards to.
	Network        string        `json:"network,omitempty"`
	XDSAddress     string        `json:"xdsAddress"`
	CAAddress      string        `json:"caAddress"`
	RootCert       string        `json:"rootCert"`
	CRLPath        string        `json:"crlPath,omitempty"`
	TokenFile      string        `json:"tokenFile"`
	Token          string        `json:"-"`
	TrustDomain    string        `json:"trustDomain"`
	ServiceAccount string        `json:"serviceAccount"`
	PodName        string        `json:"podName"`
	NodeName       string        `json:"nodeName"`
	IP             string        `json:"ip"`
	Listen         string        `json:"listen"`
	MetricsAddr    string        `json:"metricsAddr"`
	ReadinessAddr  string        `json:"readinessAddr"`
	AdminAddr      string        `json:"adminAddr"`
	DrainDuration  time.Duration `json:"drainDuration"`
	// The bootstrap tracing default, used while the control plane sends
	// no Telemetry (see proxy/waypoint Options.DefaultTracing).
	TraceEndpoint string  `json:"traceEndpoint,omitempty"`
	TraceProtocol string  `json:"traceProtocol,omitempty"`
	TraceSampling float64 `json:"traceSampling"`
	// AdaptiveProcs runs on one P while the load fits in one core
	// (internal/daemon/procs); off when GOMAXPROCS is set.
	AdaptiveProcs bool `json:"adaptiveProcs"`
	CheckFlags    bool `json:"-"`
	log           daemon.LogFlags
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	gwDefault := ""
	if n, ns := os.Getenv("GATEWAY_NAME"), os.Getenv("POD_NAMESPACE"); n != "" && ns != "" {
		gwDefault = ns + "/" + n
	}
	fs.StringVar(&o.Gateway, "gateway", gwDefault, "the waypoint Gateway, namespace/name (env GATEWAY_NAME and POD_NAMESPACE)")
	fs.StringVar(&o.Mode, "mode", env("GATEWAY_MODE", modeWaypoint), "what this proxy is: "+modeWaypoint+" (an istio-waypoint Gateway) or "+modeEastWest+" (an istio-east-west Gateway, forwarding double HBONE from other networks)")
	fs.StringVar(&o.Network, "network", env("NETWORK", ""), "east-west mode (a waypoint ignores it): the gateway's network (its Gateway's topology.istio.io/network label); only endpoints and waypoints on it are forwarded to; empty: the default network")
	fs.StringVar(&o.XDSAddress, "xds-address", env("XDS_ADDRESS", "istiod.istio-system.svc:15012"), "control plane delta xDS, host:port")
	fs.StringVar(&o.CAAddress, "ca-address", env("CA_ADDRESS", ""), "mesh CA, host:port; empty: the xDS address")
	fs.StringVar(&o.RootCert, "root-cert", env("ROOT_CERT", "/var/run/secrets/istio/root-cert.pem"), "PEM roots verifying the control plane (xDS and CA); re-read on change")
	fs.StringVar(&o.CRLPath, "crl-path", env("CRL_PATH", ""), "CRLs (PEM or DER) signed by the --root-cert root: HBONE peers, in and out, whose chain they revoke are refused, re-read every 5 s; empty: no revocation checks")
	fs.StringVar(&o.TokenFile, "token-file", env("TOKEN_FILE", "/var/run/secrets/tokens/istio-token"), "bearer token for xDS and the CA, read on each use")
	fs.StringVar(&o.Token, "token", "", "static bearer token (wins over --token-file; local mode)")
	fs.StringVar(&o.TrustDomain, "trust-domain", env("TRUST_DOMAIN", identity.DefaultTrustDomain), "trust domain of the waypoint's identity")
	fs.StringVar(&o.ServiceAccount, "service-account", env("SERVICE_ACCOUNT", ""), "the waypoint's service account; empty: the Gateway's name")
	fs.StringVar(&o.PodName, "pod-name", env("POD_NAME", ""), "this pod's name; empty: waypoint-<gateway name>")
	fs.StringVar(&o.NodeName, "node-name", env("NODE_NAME", ""), "the node this pod runs on")
	fs.StringVar(&o.IP, "ip", env("INSTANCE_IP", ""), "this pod's IP (source of upstream HBONE)")
	fs.StringVar(&o.Listen, "listen", ":15008", "HBONE listen address")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "[::]:15020", "Prometheus /metrics; empty disables")
	fs.StringVar(&o.ReadinessAddr, "readiness-addr", "[::]:15021", "readiness "+daemon.ReadyPath+"; empty disables")
	fs.StringVar(&o.AdminAddr, "admin-addr", "localhost:15000", "admin (/config_dump, /logging, pprof), loopback only; empty disables")
	fs.DurationVar(&o.DrainDuration, "drain-duration", 5*time.Second, "how long open tunnels may finish after SIGTERM")
	fs.StringVar(&o.TraceEndpoint, "tracing-endpoint", env("TRACING_ENDPOINT", ""), "OpenTelemetry collector host:port for spans while the control plane sends no Telemetry (a bootstrap default, as meshConfig defaultConfig.tracing); empty: none")
	fs.StringVar(&o.TraceProtocol, "tracing-protocol", env("TRACING_PROTOCOL", "grpc"), "OTLP protocol of --tracing-endpoint: grpc or http")
	fs.Float64Var(&o.TraceSampling, "tracing-sampling", 1, "random sampling percentage of --tracing-endpoint, 0 to 100 (Istio's default 1)")
	fs.BoolVar(&o.AdaptiveProcs, "adaptive-procs", env("ADAPTIVE_PROCS", "true") == "true", "run on one P (GOMAXPROCS 1) while the load stays under a core, on all of them above it: at a low load most of a request's hand-off from a connection's read loop to its goroutine is the runtime waking a second thread; off when GOMAXPROCS is set (env ADAPTIVE_PROCS)")
	fs.BoolVar(&o.CheckFlags, "check-flags", false, "print the parsed options as JSON and exit")
	o.log.Register(fs, "", "")
	version := daemon.VersionFlag(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *version {
		return nil, daemon.ErrVersion
	}
	if os.Getenv("GOMAXPROCS") != "" {
		o.AdaptiveProcs = false // the operator chose a count
	}
	var errs []error
	ns, gw, ok := strings.Cut(o.Gateway, "/")
	if !ok || ns == "" || gw == "" {
		errs = append(errs, fmt.Errorf("--gateway %q: want namespace/name", o.Gateway))
	}
	if o.ServiceAccount == "" {
		o.ServiceAccount = gw
	}
	switch o.Mode {
	case modeWaypoint, modeEastWest: // a waypoint ignores --network
	default:
		errs = append(errs, fmt.Errorf("--mode %q: want %s or %s", o.Mode, modeWaypoint, modeEastWest))
	}
	if o.PodName == "" {
		o.PodName = o.Mode + "-" + gw
	}
	if o.CAAddress == "" {
		o.CAAddress = o.XDSAddress
	}
	if _, err := netip.ParseAddr(o.IP); err != nil {
		errs = append(errs, fmt.Errorf("--ip %q: %w", o.IP, err))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name is required"))
	}
	if o.TraceProtocol != "grpc" && o.TraceProtocol != "http" {
		errs = append(errs, fmt.Errorf("--tracing-protocol %q: want grpc or http", o.TraceProtocol))
	}
	if o.TraceSampling < 0 || o.TraceSampling > 100 {
		errs = append(errs, fmt.Errorf("--tracing-sampling %v: want 0 to 100", o.TraceSampling))
	}
	if _, err := identity.New(o.TrustDomain, ns, o.ServiceAccount); ok && err != nil {
		errs = append(errs, fmt.Errorf("identity: %w", err))
	}
	for _, a := range []struct {
		flag, v string
		debug   bool
	}{{"metrics-addr", o.MetricsAddr, false}, {"readiness-addr", o.ReadinessAddr, false}, {"admin-addr", o.AdminAddr, true}} {
		if a.v != "" {
			if err := daemon.ValidateAddr(a.v, a.debug); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", a.flag, err))
			}
		}
	}
	if _, err := o.log.Config(); err != nil {
		errs = append(errs, err)
	}
	return o, errors.Join(errs...)
}
