package waypoint

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authn"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/authz"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/h1"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/pathnorm"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/routing"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry/tracing"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/upstream"
)

// DeniedBody is the body of a 403 from authorization, as Istio's.
const DeniedBody = "RBAC: access denied"

// Options configures a Waypoint. Name, Identity, IP, Certs and Pool are
// required.
type Options struct {
	// Name is the waypoint's xDS resource name, "<namespace>/<name>" of its
	// Gateway.
	Name string
	// Identity is the waypoint's own SPIFFE identity (its certificate's).
	Identity identity.Identity
	// IP is the waypoint pod's address: the source of upstream HBONE.
	IP netip.Addr
	// Certs supplies the waypoint's certificate for the inbound server.
	Certs identity.CertSource
	// Pool carries upstream HBONE with the waypoint's identity.
	Pool *hbone.Pool
	// DialTCP opens a plain TCP connection to a non-HBONE destination; nil:
	// net.Dialer.
	DialTCP func(ctx context.Context, dst netip.AddrPort) (net.Conn, error)
	// Log receives errors; Access one line per request. nil: none.
	Log, Access *zap.Logger
	// AccessLines, when set, writes Access's lines itself (it must be the
	// same JSON logger's: telemetry.Recorder.UseJSONLines).
	AccessLines *daemon.JSONLines
	// Registerer receives the istio_* metrics; nil: not registered.
	Registerer prometheus.Registerer
	// MetricsLimits bound the metrics' series; zero: telemetry's defaults.
	MetricsLimits telemetry.Limits
	// Rand returns a number in [0, n); nil: math/rand/v2. Tests fix it.
	Rand func(n uint64) uint64
	// Revocation refuses HBONE clients whose certificate chain a CRL
	// revokes (CRL_PATH), and closes their open tunnels when a reload
	// revokes them; nil: no revocation checks. The upstream side's checks
	// are the Pool's (hbone.ClientConfig.Revocation).
	Revocation hbone.Revocation
	// Trace is the waypoint's own identity in its spans' attributes; what
	// is empty is derived from Name and IP. Tracing itself (providers,
	// sampling, tags) comes with the config (Telemetry's tracing).
	Trace tracing.Identity
	// TraceBatchTimeout is the longest a span waits for export; 0: 5 s.
	TraceBatchTimeout time.Duration
	// DefaultTracing is the tracing of a config without Telemetry (the
	// control plane resolved no Telemetry object and no default provider
	// for this waypoint): a bootstrap default, as Istio's proxies take
	// meshConfig defaultConfig.tracing at start. nil: no tracing then.
	DefaultTracing *tracing.Config
	// DetectTimeout is how long a tunnel to a port of no declared
	// protocol (AUTO) waits for the client's first bytes before it is
	// served as TCP; zero: DefaultDetectTimeout.
	DetectTimeout time.Duration
}

// Waypoint is the data path of one waypoint.
type Waypoint struct {
	opts    Options
	sink    *sink
	srv     *hbone.Server
	stats   *telemetry.Recorder
	tracer  *tracing.Tracer
	log     *zap.Logger
	httpLn  *connListener
	httpSrv *http.Server
	h1, h2  http.RoundTripper
	limited sync.Map          // connLimits → *limitedTransports (connlimits.go)
	h1tls   http.RoundTripper // HTTP/1.1 over TLS the waypoint originates (DestinationRule tls)
	wg      sync.WaitGroup
	router  *routing.Router // its endpoint state outlives config pushes

	// The HTTP/1.1 fast path (fastpath.go): its connections (Shutdown
	// closes the idle ones) and its idle upstream connections.
	fast      *h1.Server
	upstreams upstream.Pool
	// slowPath serves every tunnel with net/http's server and
	// ReverseProxy (tests compare the two).
	slowPath bool
	// upstreamDial replaces dial on the fast path (tests: an endpoint of
	// their own); fallbacks counts tunnels it handed to net/http.
	upstreamDial func(ctx context.Context, target netip.AddrPort, forwarded string) (net.Conn, error)
	fallbacks    atomic.Int64
}

// New builds a waypoint. Hand Sink to the xDS client and a listener to Serve.
func New(opts Options) (*Waypoint, error) {
	if opts.Name == "" || opts.Identity.IsZero() || !opts.IP.IsValid() || opts.Certs == nil || opts.Pool == nil {
		return nil, errors.New("waypoint: Name, Identity, IP, Certs and Pool are required")
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.Access == nil {
		opts.Access = zap.NewNop()
	}
	if opts.DialTCP == nil {
		opts.DialTCP = func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", dst.String())
		}
	}
	if opts.Rand == nil {
		opts.Rand = rand.Uint64N
	}
	if opts.DetectTimeout <= 0 {
		opts.DetectTimeout = DefaultDetectTimeout
	}
	stats, err := telemetry.New(opts.Registerer, opts.Access, opts.MetricsLimits)
	if err != nil {
		return nil, fmt.Errorf("waypoint: metrics: %w", err)
	}
	if opts.AccessLines != nil {
		stats.UseJSONLines(opts.AccessLines)
	}
	tracer := tracing.New(traceIdentity(opts), opts.Log.Named("tracing"))
	tracer.BatchTimeout = opts.TraceBatchTimeout
	sk := newSink(opts.Name, tracer)
	sk.defaultTracing = opts.DefaultTracing
	sk.stats = stats
	if err := sk.applyDefaultTracing(); err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	w := &Waypoint{opts: opts, sink: sk, stats: stats, tracer: tracer, log: opts.Log,
		router: routing.New(opts.IP, opts.Rand, opts.Log), fast: h1.NewServer(opts.Log)}
	w.srv, err = hbone.NewServer(hbone.ServerConfig{
		Identity: opts.Identity, Certs: opts.Certs, Handler: hbone.HandlerFunc(w.ServeHBONE), Logger: opts.Log.Named("hbone"),
		Revocation: opts.Revocation,
	})
	if err != nil {
		return nil, fmt.Errorf("waypoint: %w", err)
	}
	w.initHTTP()
	return w, nil
}

// traceIdentity fills in what opts.Trace leaves empty: the waypoint is
// the canonical service named after its Gateway, in the Gateway's
// namespace, and its node id is Istio's "waypoint~<ip>~<name>.<ns>~<ns>.svc.cluster.local".
func traceIdentity(opts Options) tracing.Identity {
	id := opts.Trace
	ns, name, _ := strings.Cut(opts.Name, "/")
	if id.Namespace == "" {
		id.Namespace = ns
	}
	if id.CanonicalService == "" {
		id.CanonicalService = name
	}
	if id.NodeID == "" {
		id.NodeID = "waypoint~" + opts.IP.String() + "~" + name + "." + ns + "~" + ns + ".svc.cluster.local"
	}
	return id
}

// Sink is what the xDS client feeds (the workload API and this waypoint's
// config); it implements xds.WaypointSink.
func (w *Waypoint) Sink() xds.Sink { return w.sink }

// Snapshot returns the current workload API state.
func (w *Waypoint) Snapshot() *state.Snapshot { return w.sink.Load() }

// Config returns the current compiled config.
func (w *Waypoint) Config() *Config { return w.sink.cfg.Load() }

// Serve serves HBONE on l until Shutdown or Close.
func (w *Waypoint) Serve(l net.Listener) error { return w.srv.Serve(l) }

// Shutdown stops accepting, lets open tunnels and requests finish until ctx
// ends, then closes what is left.
func (w *Waypoint) Shutdown(ctx context.Context) error {
	w.fast.Shutdown()
	err := w.srv.Shutdown(ctx)
	herr := w.httpSrv.Shutdown(ctx)
	if herr != nil {
		w.httpSrv.Close()
	}
	w.fast.Close()
	w.upstreams.Close()
	w.closeLimited()
	w.stats.Close(ctx) // flush the OTLP access logs of the last requests
	return errors.Join(err, herr, w.tracer.Close(ctx))
}

// Close stops everything now.
func (w *Waypoint) Close() error {
	w.fast.Close()
	w.upstreams.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // now: what is queued is dropped
	_ = w.tracer.Close(ctx)
	w.closeLimited()
	return errors.Join(w.srv.Close(), w.httpSrv.Close())
}

// exchange is one request (or TCP connection) as it moves through the
// filters. Each step reads what the earlier steps filled in.
type exchange struct {
	// metadata
	src, dst netip.AddrPort
	peer     identity.Identity
	// principal: peer's SPIFFE URI, made once per tunnel (ServeHBONE);
	// "": not made yet.
	principal string
	baggage   hbone.Baggage
	source    telemetry.Peer // for the stats step
	// srcWorkload: the uid of the client's workload, proven (its address
	// and the peer certificate's identity agree); "": not proven.
	srcWorkload string
	svc         *boundService // nil when a workload was addressed
	protocol    waypointapi.Protocol
	mirror      string // what request mirroring did ("": no mirror)
	grpcStatus  string // the response's grpc-status, for the stats step
	attrs       stream.Attrs
	h2          bool
	req         *http.Request
	cfg         *Config
	snap        *state.Snapshot
	verdict     stream.Verdict
	rule        *routing.Rule
	edit        routing.Edit // what the rule (and its backend) do to the request
	route       string
	target      netip.AddrPort  // routing result: the endpoint (or VIP for TCP)
	picked      *routing.Picked // the endpoint a DestinationRule policy picked
	lastPicked  *routing.Picked // the previous attempt's (a retry's circuit breaker)
	setCookie   string          // a consistent hash's generated cookie, for the response
	tls         *tls.Config     // TLS to originate to target (DestinationRule tls); nil: none
	upstream    string          // how target is reached (route.Kind's name); "": not routed
	destination telemetry.Peer  // the endpoint picked, for the stats step
	span        *tracing.Span   // nil: tracing off
	traceparent string          // the HBONE CONNECT's, when valid (TCP streams)
	err         error
	// body counts the fast path's request body: kept here, not allocated
	// on its own, as the exchange is allocated for each request anyway.
	body countingBody
}

// decide runs the filters in their one order: metadata → authentication →
// authorization → routing. Stats is the caller's last step (record), once the
// outcome is known. It returns nil when the request may proceed to
// ex.target; a *stream.Refusal (with the HTTP status to answer) otherwise.
func (w *Waypoint) decide(ex *exchange) error {
	// 1. metadata: who is asking, from the verified certificate; baggage and
	// the workload API name the source workload for telemetry only.
	principal := ex.principal
	if principal == "" {
		principal = ex.peer.String()
	}
	ex.attrs.Principal = strings.TrimPrefix(principal, "spiffe://")
	ex.attrs.Namespace = ex.peer.Namespace
	ex.attrs.SrcIP, ex.attrs.DstIP, ex.attrs.DstPort = ex.src.Addr(), ex.dst.Addr(), ex.dst.Port()
	ex.source, ex.srcWorkload = sourcePeer(ex.snap, ex.src.Addr(), ex.peer, ex.baggage)
	if !ex.peer.IsZero() {
		ex.source.Principal = principal
	}
	if ex.svc != nil {
		ex.attrs.Service = ex.svc.hostname
	}
	if ex.attrs.HTTP {
		if err := normalizeRequest(ex); err != nil {
			return err
		}
	}
	// 2. authentication: the peer by mTLS (hbone.Server verified its
	// certificate); the request by its JWT (RequestAuthentication): none
	// is anonymous, an invalid one is a 401. Plain TCP has no request.
	if ex.attrs.HTTP {
		auth, err := authn.Authenticate(ex.cfg.authn, ex.attrs.Service, ex.req, time.Now())
		if err != nil {
			return &stream.Refusal{Code: http.StatusUnauthorized, Msg: err.Error(), Body: err.(*authn.Error).Body()}
		}
		ex.attrs.Auth = auth
	}

	// 3. authorization.
	ex.verdict = authz.Authorize(ex.cfg.policies, &ex.attrs)
	if !ex.verdict.Allow {
		return &stream.Refusal{Code: http.StatusForbidden, Msg: ex.verdict.Reason}
	}
	// 4. routing.
	return w.routeTo(ex)
}

// routeTo is the routing step: it picks the endpoint (for HTTP through the
// service's routes) and fills in where the request goes.
func (w *Waypoint) routeTo(ex *exchange) error { return w.routeAttempt(ex, false) }

// rerouteTo routes a retry: the same rule and weighted backend as the
// attempt before (routing.Router.Retry), another endpoint.
func (w *Waypoint) rerouteTo(ex *exchange) error { return w.routeAttempt(ex, true) }

func (w *Waypoint) routeAttempt(ex *exchange, retry bool) error {
	var table *routing.Table
	if ex.attrs.HTTP && ex.svc != nil {
		table = ex.svc.routes
	}
	c := routing.Client{Namespace: ex.peer.Namespace, WorkloadUID: ex.srcWorkload}
	var res routing.Result
	var err error
	if retry {
		res, err = w.router.Retry(ex.snap, ex.src, ex.dst, table, ex.req, c, ex.edit)
	} else {
		res, err = w.router.Route(ex.snap, ex.src, ex.dst, table, ex.req, c)
	}
	if table != nil {
		ex.rule, ex.edit = res.Rule, res.Edit
		if res.Rule != nil {
			ex.route = res.Rule.Route()
		}
	}
	if err != nil {
		return err
	}
	ex.picked, ex.setCookie = res.Picked, res.SetCookie
	if w := res.DstWorkload; w != nil {
		ex.destination = telemetry.Peer{Workload: res.DstName, Namespace: res.DstNamespace, Principal: res.DstPrincipal,
			CanonicalService: w.CanonicalName, CanonicalRevision: w.CanonicalRevision, Cluster: w.ClusterID}
	}
	ex.target, ex.upstream, ex.tls = res.Target, res.Via, res.TLS
	return nil
}

// endpointDone ends the attempt ex.picked made (routing.Router.Done); nil
// resp and err: it never went upstream.
func (w *Waypoint) endpointDone(ctx context.Context, ex *exchange, resp *http.Response, err error) {
	pk := ex.picked
	if pk == nil {
		return
	}
	ex.picked, ex.lastPicked = nil, pk
	w.router.Done(ctx, pk, ex.route, resp, err)
}

// dial opens a connection to an endpoint address (podIP:port) the routing
// step chose: HBONE through its node proxy with the waypoint's identity, or
// plain TCP to a workload outside HBONE.
func (w *Waypoint) dial(ctx context.Context, target netip.AddrPort, forwarded string) (net.Conn, error) {
	return w.dialTrace(ctx, target, forwarded, "")
}

// dialTrace is dial whose HBONE CONNECT carries traceparent ("": a new
// random one, as every node proxy's CONNECT has).
func (w *Waypoint) dialTrace(ctx context.Context, target netip.AddrPort, forwarded, traceparent string) (net.Conn, error) {
	snap := w.sink.Load()
	self := snap.WorkloadByIP("", w.opts.IP)
	d, err := route.Outbound(snap, self, target)
	if err != nil {
		return nil, err
	}
	switch d.Kind {
	case route.HBONE:
		return w.opts.Pool.Connect(ctx, &hbone.ConnectRequest{
			Key:       hbone.Key{Src: w.opts.Identity, Dst: d.UpstreamIdentities(), SrcIP: w.opts.IP, NextHop: d.NextHop},
			Authority: d.Authority, Forwarded: forwarded, Traceparent: traceparent,
		})
	case route.DoubleHBONE:
		// An endpoint on another network (Istio 1.27+ waypoints route
		// there): the outer CONNECT to its network gateway, the inner one
		// through it to the endpoint, which sees the waypoint's identity.
		outer := &hbone.ConnectRequest{
			Key:       hbone.Key{Src: w.opts.Identity, Dst: d.UpstreamIdentities(), SrcIP: w.opts.IP, NextHop: d.NextHop},
			Authority: d.Authority, Host: d.AuthorityHost, Forwarded: forwarded,
		}
		inner := *outer
		inner.Key.Dst = d.FinalIdentities()
		inner.Traceparent = traceparent
		if self != nil {
			inner.ForwardedNetwork = self.Network
		}
		return w.opts.Pool.ConnectThrough(ctx, outer, &inner)
	case route.Direct:
		return w.opts.DialTCP(ctx, d.NextHop)
	}
	return nil, fmt.Errorf("waypoint: %s is not in the mesh (%s)", target, d.Kind)
}

// ServeHBONE accepts one CONNECT: only to a destination bound to this
// waypoint; then TCP (L4 filters, splice) or HTTP (served inside the tunnel).
func (w *Waypoint) ServeHBONE(ctx context.Context, req *hbone.Request) hbone.Reply {
	start := time.Now()
	ex := &exchange{dst: req.Authority, peer: req.Peer, principal: req.Peer.String(), cfg: w.sink.cfg.Load(), snap: w.sink.Load(), baggage: hbone.ParseBaggage(req.Baggage)}
	if hbone.ValidTraceparent(req.Traceparent) {
		ex.traceparent = req.Traceparent
	}
	if ta, ok := req.RemoteAddr.(*net.TCPAddr); ok {
		ex.src = ta.AddrPort()
		ex.src = netip.AddrPortFrom(ex.src.Addr().Unmap(), ex.src.Port())
	}
	dstIP := req.Authority.Addr().Unmap()
	if svc := ex.cfg.services[dstIP]; svc != nil {
		p, ok := svc.ports[req.Authority.Port()]
		if !ok {
			ex.err = fmt.Errorf("port %d is not a port of service %s", req.Authority.Port(), svc.hostname)
			w.record(ex, http.StatusServiceUnavailable, "NR", time.Since(start), telemetry.Sizes{})
			return hbone.Reply{Status: http.StatusServiceUnavailable}
		}
		ex.svc, ex.protocol = svc, p
	} else if ex.cfg.workloads[dstIP] == nil {
		// Not bound here: refusing is what keeps the waypoint from being an
		// open relay.
		ex.err = fmt.Errorf("%s is not bound to waypoint %s", req.Authority, w.opts.Name)
		w.record(ex, http.StatusForbidden, "NR", time.Since(start), telemetry.Sizes{})
		return hbone.Reply{Status: http.StatusForbidden}
	}
	if ex.protocol == waypointapi.Protocol_TCP {
		return w.serveTCP(ctx, ex, start)
	}
	meta := &tunnelMeta{src: ex.src, dst: ex.dst, peer: ex.peer, principal: ex.principal, baggage: ex.baggage, svc: ex.svc, protocol: ex.protocol}
	select {
	case <-w.httpLn.closed:
		return hbone.Reply{Status: http.StatusServiceUnavailable}
	default:
	}
	if ex.protocol == waypointapi.Protocol_AUTO {
		return hbone.Reply{Status: http.StatusOK, Serve: func(t *hbone.Tunnel) error { return w.serveAuto(t, ex, meta, start) }}
	}
	return hbone.Reply{Status: http.StatusOK, Serve: func(t *hbone.Tunnel) error { return w.serveTunnelPre(t, meta, nil) }}
}

// serveTCP runs the same filters for a plain TCP tunnel (HTTP fields never
// match) and splices it to the endpoint.
func (w *Waypoint) serveTCP(ctx context.Context, ex *exchange, start time.Time) hbone.Reply {
	if err := w.decideTCP(ex); err != nil {
		var nr *stream.Refusal
		code := http.StatusServiceUnavailable
		if errors.As(err, &nr) {
			code = nr.Code
		}
		ex.err = err
		w.record(ex, code, flagFor(code, err), time.Since(start), telemetry.Sizes{})
		return hbone.Reply{Status: code}
	}
	// The client's CONNECT traceparent goes on to the endpoint's node
	// proxy, so both ends of the stream log one trace id (as ztunnel's).
	up, err := w.dialTrace(ctx, ex.target, hbone.BuildForwarded(ex.src, ex.attrs.Service), ex.traceparent)
	if err != nil {
		ex.err = err
		w.record(ex, http.StatusServiceUnavailable, "UF", time.Since(start), telemetry.Sizes{})
		return hbone.Reply{Status: http.StatusServiceUnavailable}
	}
	st := w.record(ex, http.StatusOK, "", time.Since(start), telemetry.Sizes{})
	return hbone.Reply{Status: http.StatusOK, Upstream: up, Done: func(ts hbone.TunnelStats, _ error) {
		// Read out of the tunnel: from the client (received); written
		// into it: to the client (sent).
		st.Done(ts.BytesReceived, ts.BytesSent)
	}}
}

// errTCPOrigination refuses a TCP stream to a service whose
// DestinationRule has the waypoint originate TLS: only HTTP ports do.
var errTCPOrigination = &stream.Refusal{Code: http.StatusServiceUnavailable,
	Msg: "DestinationRule tls (SIMPLE, MUTUAL) is originated on HTTP ports only; a TCP stream is refused, never sent in plaintext"}

// decideTCP is decide for a TCP stream.
func (w *Waypoint) decideTCP(ex *exchange) error {
	if ex.svc != nil && ex.svc.originatesTLS {
		return errTCPOrigination
	}
	return w.decide(ex)
}

// record is the stats step, whatever step answered. For an accepted TCP
// stream it returns the stream's report (see telemetry.Recorder.Record).
func (w *Waypoint) record(ex *exchange, code int, flags string, d time.Duration, sizes telemetry.Sizes) *telemetry.Stream {
	e := telemetry.Entry{
		Src: ex.src, Dst: ex.dst, Peer: ex.peer, Source: ex.source, Destination: ex.destination, Attrs: &ex.attrs, Req: ex.req,
		GRPCStatus: ex.grpcStatus, Verdict: &ex.verdict, Route: ex.route, Upstream: ex.upstream, Mirror: ex.mirror, Err: ex.err,
		Code: code, Flags: flags, Duration: d, Sizes: sizes, Telemetry: ex.cfg.telemetryFor(ex.svc),
		Generation: ex.cfg.statsGen,
	}
	if ex.upstream != "" {
		e.UpstreamTo = ex.target
	}
	if ex.svc != nil {
		e.ServiceName, e.ServiceNamespace = ex.svc.name, ex.svc.namespace
	}
	ex.span.End(&e)
	return w.stats.Record(&e)
}

// sourcePeer names the client for telemetry: the workload at its address
// when that workload's identity is the certificate's, else what its
// baggage says when the certificate's namespace vouches for it (a client
// in another cluster), else only the certificate's namespace. uid is the
// workload's only in the first case, the one the waypoint can prove:
// baggage is the client's own word and never selects a route.
func sourcePeer(snap *state.Snapshot, ip netip.Addr, peer identity.Identity, bg hbone.Baggage) (p telemetry.Peer, uid string) {
	if sw := snap.WorkloadByIP("", ip); sw != nil && sw.Identity() == peer {
		name := sw.WorkloadName
		if name == "" {
			name = sw.Name
		}
		p = telemetry.Peer{Workload: name, Namespace: sw.Namespace, CanonicalService: sw.CanonicalName,
			CanonicalRevision: sw.CanonicalRevision, Cluster: sw.ClusterID}
		if !peer.IsZero() {
			uid = sw.UID
		}
		return p, uid
	}
	if bg.WorkloadName != "" && bg.Namespace == peer.Namespace {
		return telemetry.Peer{Workload: bg.WorkloadName, Namespace: bg.Namespace, CanonicalService: bg.ServiceName,
			CanonicalRevision: bg.ServiceVersion, Cluster: bg.ClusterName}, ""
	}
	return telemetry.Peer{Namespace: peer.Namespace}, ""
}

// flagFor is the response flag of an answer with code, whose cause is err
// (a *stream.Refusal may name its own flag).
func flagFor(code int, err error) string {
	var nr *stream.Refusal
	if errors.As(err, &nr) && nr.Flag != "" {
		return nr.Flag
	}
	switch code {
	case http.StatusForbidden:
		return "RBAC"
	case http.StatusNotFound:
		return "NR"
	case http.StatusGatewayTimeout:
		return "UT"
	case http.StatusUnauthorized:
		return "" // authentication's own answer (the error says why), as Envoy's jwt_authn
	}
	return "UF"
}

// xfcc is the header Envoy sets from a client certificate; a client that
// sends its own could claim any identity to the backend.
const xfcc = "X-Forwarded-Client-Cert"

// normalizeRequest makes the request what every later step sees and what
// the backend receives, as Istio's Envoy does before its filters: a method
// that is not upper case is refused (Istio's normalization reference); the
// path is normalized by the mesh's pathNormalization and written back into
// the request, so authorization, routing and the upstream request agree;
// X-Forwarded-Client-Cert from the client is removed (Envoy's default,
// SANITIZE, which Istio keeps for the waypoint's requests: the verified peer
// identity is the HBONE certificate, not a header).
func normalizeRequest(ex *exchange) error {
	r := ex.req
	if strings.ToUpper(r.Method) != r.Method {
		return &stream.Refusal{Code: http.StatusBadRequest, Msg: fmt.Sprintf("method %q is not upper case", r.Method)}
	}
	r.Header.Del(xfcc)
	target := r.RequestURI
	if !strings.HasPrefix(target, "/") {
		// HTTP/2 :path is always origin-form; an absolute-form HTTP/1.1
		// target is matched and forwarded by its path.
		target = r.URL.EscapedPath()
		if r.URL.RawQuery != "" || r.URL.ForceQuery {
			target += "?" + r.URL.RawQuery
		}
	}
	fwd, path, err := pathnorm.Target(ex.cfg.pathNorm, target)
	if err != nil {
		return &stream.Refusal{Code: http.StatusBadRequest, Msg: fmt.Sprintf("request path %q: %v", target, err)}
	}
	ex.attrs.Path = path
	if fwd == target {
		return nil
	}
	u, err := url.ParseRequestURI(fwd)
	if err != nil {
		return &stream.Refusal{Code: http.StatusBadRequest, Msg: fmt.Sprintf("normalized path %q: %v", fwd, err)}
	}
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.URL.ForceQuery = u.Path, u.RawPath, u.RawQuery, u.ForceQuery
	r.URL.Fragment, r.URL.RawFragment = "", ""
	if strings.HasPrefix(r.RequestURI, "/") {
		r.RequestURI = fwd
	}
	return nil
}
