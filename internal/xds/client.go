package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
	"github.com/ztunnel-go/ztunnel-go/internal/identity/reloadtls"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Client defaults, as Istio's ztunnel.
const (
	DefaultInitialBackoff = 10 * time.Millisecond
	DefaultMaxBackoff     = 15 * time.Second
	// DefaultHealthyStream is how long a stream that has received a response
	// must have lived for the reconnect backoff to start over.
	DefaultHealthyStream = 5 * time.Second
	// MaxReceiveBytes bounds one xDS response.
	MaxReceiveBytes = 200 << 20
	// DefaultClusterID is sent as clusterid metadata when ClusterID is "".
	DefaultClusterID = "Kubernetes"
)

// ErrAlreadyRunning is returned by a second concurrent call of Client.Run.
var ErrAlreadyRunning = errors.New("xds: client already running")

// ClientConfig configures a Client.
type ClientConfig struct {
	// Address is the control plane, host:port, e.g.
	// "istiod.istio-system.svc:15012" or "127.0.0.1:15012". An "https://"
	// prefix (as in Istio's XDS_ADDRESS) is accepted and dropped; TLS is
	// decided by Insecure alone. Required.
	Address string
	// RootCAs verifies the server certificate. nil: the system roots.
	RootCAs *x509.CertPool
	// Roots, when set, wins over RootCAs and is asked at every (re)connect
	// (e.g. a reloading root file's pool), so a reconnect verifies the
	// server against the roots in force then.
	Roots func() *x509.CertPool
	// ServerName overrides the name checked against the server certificate.
	// "": the host part of Address.
	ServerName string
	// Insecure dials plaintext (no TLS). Only for tests.
	Insecure bool

	// TokenFile is read on every (re)connect and sent as
	// "authorization: Bearer <token>". Wins over Token. "": not used.
	TokenFile string
	// Token is a static bearer token. "" (and no TokenFile): no
	// authorization metadata.
	Token string
	// ClusterID is sent as "clusterid" metadata. "": DefaultClusterID.
	ClusterID string
	// Headers are extra gRPC metadata (XDS_HEADER_<k>=<v>). nil: none.
	Headers map[string]string

	// Node identifies this proxy. PodName, PodNamespace and InstanceIPs are
	// required.
	Node NodeInfo
	// Sink receives the decoded resources. Required.
	Sink Sink
	// Waypoint, if set, is the resource name ("<namespace>/<name>" of its
	// Gateway) of the WaypointType config this client subscribes to, besides
	// the workload API; Sink must then implement WaypointSink, and Synced
	// waits for that type too. "": not a waypoint (no subscription).
	Waypoint string
	// AddressNames, when non-nil, subscribes the Address type to these
	// resource names only instead of the wildcard (the protocol's per-node
	// filtering; ztunnel's XDS_ON_DEMAND subscribes names as it needs them,
	// this is the fixed form). nil: wildcard, every workload and service,
	// as ztunnel does by default and its DNS proxy needs. Authorization is
	// always wildcard.
	AddressNames []string

	// Log receives connect, disconnect and NACK lines. nil: no logs.
	Log *zap.Logger
	// Registerer receives the istio_xds_* metrics. nil: metrics are kept but
	// not registered (several clients in one process, e.g. a benchmark).
	Registerer prometheus.Registerer

	// InitialBackoff and MaxBackoff bound the reconnect delay, which doubles
	// after each failed stream. Zero: DefaultInitialBackoff/DefaultMaxBackoff.
	InitialBackoff, MaxBackoff time.Duration
	// HealthyStream: a stream that lived this long and received a response
	// resets the backoff. Zero: DefaultHealthyStream.
	HealthyStream time.Duration
	// Retry paces reconnects and reports their state (the daemon's
	// readiness page and config dump list it); the fields above shape its
	// policy. nil: a Retry of its own, named "xds", logging to Log.
	Retry func(backoff.Policy) *backoff.Retry
	// DialOptions are appended to the client's own (transport credentials,
	// 200 MiB receive limit). nil: none.
	DialOptions []grpc.DialOption
}

// Client is a delta ADS client. Create it with NewClient and call Run once.
type Client struct {
	cfg      ClientConfig
	log      *zap.Logger
	metrics  *clientMetrics
	h        *handler
	node     []byte // the encoded Node, sent in the first request of each stream
	nodeID   string
	dialOpts []grpc.DialOption
	running  atomic.Bool
	retry    *backoff.Retry
}

// NewClient validates cfg and builds a Client. It does not connect.
func NewClient(cfg ClientConfig) (*Client, error) {
	var errs []error
	if cfg.Address == "" {
		errs = append(errs, errors.New("Address is required"))
	}
	if cfg.Sink == nil {
		errs = append(errs, errors.New("Sink is required"))
	}
	if err := cfg.Node.validate(); err != nil {
		errs = append(errs, err)
	}
	if _, ok := cfg.Sink.(WaypointSink); cfg.Waypoint != "" && cfg.Sink != nil && !ok {
		errs = append(errs, errors.New("Waypoint is set but Sink does not implement WaypointSink"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("xds: client config: %w", err)
	}
	cfg.Address = strings.TrimPrefix(cfg.Address, "https://")
	if cfg.InitialBackoff <= 0 {
		cfg.InitialBackoff = DefaultInitialBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.HealthyStream <= 0 {
		cfg.HealthyStream = DefaultHealthyStream
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = DefaultClusterID
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	m, err := newClientMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	var creds credentials.TransportCredentials
	if cfg.Insecure {
		creds = insecure.NewCredentials()
	} else if cfg.Roots != nil {
		creds = reloadtls.Credentials(cfg.Roots, cfg.ServerName)
	} else {
		creds = credentials.NewTLS(&tls.Config{
			RootCAs:    cfg.RootCAs,
			ServerName: cfg.ServerName,
			MinVersion: tls.VersionTLS12,
		})
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxReceiveBytes)),
	}
	opts = append(opts, cfg.DialOptions...)
	log = log.With(zap.String("xds.address", cfg.Address))
	// Jitter ±50 % spreads a fleet reconnecting to a restarted control
	// plane.
	policy := backoff.Policy{Initial: cfg.InitialBackoff, Max: cfg.MaxBackoff, Jitter: 0.5, Healthy: cfg.HealthyStream}
	retry := backoff.New("xds", policy, log)
	if cfg.Retry != nil {
		retry = cfg.Retry(policy)
	}
	return &Client{
		cfg:      cfg,
		log:      log,
		metrics:  m,
		h:        newWaypointHandler(cfg.Sink, cfg.Waypoint),
		node:     cfg.Node.encode(),
		nodeID:   cfg.Node.ID(),
		dialOpts: opts,
		retry:    retry,
	}, nil
}

// Synced is closed once the first response of both types has been applied
// to the Sink. Readiness gates on it.
func (c *Client) Synced() <-chan struct{} { return c.h.synced }

// ResourceVersions returns a copy of the accepted versions (name → version)
// of one type: what the client would send as initial_resource_versions.
func (c *Client) ResourceVersions(typeURL string) map[string]string {
	return c.h.resourceVersions(typeURL)
}

// Run connects and keeps the subscription alive until ctx is done, then
// returns nil. Between streams it waits with exponential backoff; the Sink
// keeps the last applied state meanwhile. Run returns ErrAlreadyRunning if
// the client is already running.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer c.running.Store(false)

	for {
		out := c.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.metrics.terminations.WithLabelValues(out.reason).Inc()
		if out.served {
			c.log.Warn("disconnected", zap.String("reason", out.reason), zap.Error(out.err))
		}
		// The retry logs the streak's start and each backoff step; a stream
		// that ends before HealthyStream keeps the streak's step.
		if c.retry.Wait(ctx, fmt.Errorf("%s: %w", out.reason, out.err)) != nil {
			return nil
		}
	}
}

// The delta ADS method (envoy/service/discovery/v3/ads.proto), a
// bidirectional stream.
const deltaADSMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"

var deltaADSStream = grpc.StreamDesc{StreamName: "DeltaAggregatedResources", ServerStreams: true, ClientStreams: true}

// outcome is how one stream ended.
type outcome struct {
	reason string
	err    error
	served bool // at least one response arrived
}

// stream runs one ADS stream on a fresh connection until it fails or ctx is
// done.
func (c *Client) stream(ctx context.Context) outcome {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	md, err := c.metadata()
	if err != nil {
		return outcome{reason: ReasonConnectionError, err: err}
	}
	conn, err := grpc.NewClient(c.cfg.Address, c.dialOpts...)
	if err != nil {
		return outcome{reason: ReasonConnectionError, err: fmt.Errorf("xds: dial %s: %w", c.cfg.Address, err)}
	}
	defer conn.Close()

	// The codec is this call's alone (wire.go); StaticMethod, as generated
	// clients pass it, lets stats handlers label the method by name.
	st, err := conn.NewStream(metadata.NewOutgoingContext(ctx, md), &deltaADSStream, deltaADSMethod,
		grpc.ForceCodecV2(codec{}), grpc.StaticMethod())
	if err != nil {
		return outcome{reason: ReasonConnectionError, err: fmt.Errorf("xds: open stream to %s: %w", c.cfg.Address, err)}
	}
	for i, t := range c.h.types {
		req := c.h.initialRequest(t)
		if t == AddressType && c.cfg.AddressNames != nil {
			req.subscribe = c.cfg.AddressNames
		}
		if i == 0 {
			req.node = c.node
		}
		if err := st.SendMsg(req); err != nil {
			// io.EOF means the stream broke; Recv below returns why.
			break
		}
	}

	served := false
	for {
		resp := new(deltaResponse)
		if err := st.RecvMsg(resp); err != nil {
			return c.ended(err, served)
		}
		c.metrics.messages.WithLabelValues(resp.typeURL).Inc()
		c.metrics.bytes.WithLabelValues(resp.typeURL).Add(float64(resp.size))
		if !served {
			served = true
			c.log.Info("connected", zap.String("node", c.nodeID))
			c.retry.Succeeded()
		}
		ack := c.h.handle(resp)
		if ack.errorDetail != nil {
			c.log.Warn("rejected resources (NACK)",
				zap.String("type_url", resp.typeURL),
				zap.String("nonce", resp.nonce),
				zap.String("message", ack.errorDetail.message))
		}
		// On a send error the next Recv returns the stream's status.
		_ = st.SendMsg(ack)
	}
}

func (c *Client) ended(err error, served bool) outcome {
	switch {
	case errors.Is(err, io.EOF):
		return outcome{reason: ReasonComplete, err: fmt.Errorf("xds: server %s closed the stream", c.cfg.Address), served: served}
	case !served:
		return outcome{reason: ReasonConnectionError, err: fmt.Errorf("xds: stream to %s: %w", c.cfg.Address, err)}
	default:
		reason := ReasonError
		if status.Code(err) == codes.Unavailable {
			reason = ReasonConnectionError // the transport broke
		}
		return outcome{reason: reason, err: fmt.Errorf("xds: stream to %s: %w", c.cfg.Address, err), served: true}
	}
}

// metadata builds the per-stream gRPC metadata, reading the token file.
func (c *Client) metadata() (metadata.MD, error) {
	md := metadata.MD{}
	for k, v := range c.cfg.Headers {
		md.Set(k, v)
	}
	md.Set("clusterid", c.cfg.ClusterID)
	token := c.cfg.Token
	if c.cfg.TokenFile != "" {
		b, err := os.ReadFile(c.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("xds: read token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token != "" {
		md.Set("authorization", "Bearer "+token)
	}
	return md, nil
}
