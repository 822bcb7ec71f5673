package xds

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	gcplog "github.com/envoyproxy/go-control-plane/pkg/log"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// Server invariants:
//   - One go-control-plane LinearCache per type URL; the set of types is fixed
//     at NewServer, so the MuxCache map is never written afterwards.
//   - typeCache.versions mirrors the cache content: name → sha256 of the
//     deterministic encoding, the same per-resource version the LinearCache
//     reports to delta clients. SetResources hands the LinearCache only the
//     resources whose version changed and the names that disappeared, so
//     watches fire only for those and clients receive only those.
//   - The LinearCache encodes each stored resource once (lazily, memoized per
//     resource) and every client's response reuses those bytes: the per-change
//     cost is one encoding per changed resource plus, per client, a version
//     comparison over the type's resources (LinearCache walks them for each
//     wildcard watch).
//   - A stream's node id is known from its first request; NACKs are logged with
//     it.
//   - Streams are held (not answered) until SetResources has been called for
//     every type at least once: a restarted control plane that answered a
//     reconnecting client before loading its state would tell it to remove
//     everything it holds.

// ServerConfig configures a Server.
type ServerConfig struct {
	// Log receives stream and NACK lines. nil: no logs.
	Log *zap.Logger
	// Registerer receives the xds_server_* metrics. nil: not registered.
	Registerer prometheus.Registerer
}

// Server serves delta ADS for the Address and Authorization types.
// Authentication is the caller's: install gRPC interceptors on the
// grpc.Server passed to Register.
type Server struct {
	log     *zap.Logger
	caches  map[string]*typeCache
	delta   delta.Server
	metrics *serverMetrics

	ready    chan struct{} // closed once every type has been set
	setTypes atomic.Int32  // types set at least once

	clients atomic.Int64
	mu      sync.Mutex
	streams map[int64]*streamInfo
}

type typeCache struct {
	mu       sync.Mutex // serializes SetResources of this type
	linear   *cache.LinearCache
	versions map[string]string
	set      bool // SetResources has been called
}

type streamInfo struct {
	peer   string
	nodeID string // "" until the first request with a node
}

type serverMetrics struct {
	clients   prometheus.GaugeFunc
	resources *prometheus.GaugeVec
	pushes    *prometheus.CounterVec
	pushed    *prometheus.CounterVec
	nacks     *prometheus.CounterVec
}

// NewServer builds a Server with empty resource sets. Metric registration
// errors (a name registered twice) are logged; the server works without them.
func NewServer(cfg ServerConfig) *Server {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	s := &Server{
		log:     log,
		caches:  make(map[string]*typeCache, len(typeURLs)),
		streams: map[int64]*streamInfo{},
		ready:   make(chan struct{}),
	}
	// go-control-plane logs every watch at Info; keep it at Debug.
	sugar := log.Named("gcp").Sugar()
	gl := gcplog.LoggerFuncs{DebugFunc: sugar.Debugf, InfoFunc: sugar.Debugf, WarnFunc: sugar.Warnf, ErrorFunc: sugar.Errorf}
	mux := &cache.MuxCache{
		Classify:      func(r *cache.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cache.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        make(map[string]cache.Cache, len(typeURLs)),
	}
	for _, t := range typeURLs {
		lc := cache.NewLinearCache(t, cache.WithLogger(gl))
		s.caches[t] = &typeCache{linear: lc, versions: map[string]string{}}
		mux.Caches[t] = lc
	}
	s.delta = delta.NewServer(context.Background(), mux, callbacks{s}, delta.WithLogger(gl))

	s.metrics = &serverMetrics{
		clients: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "xds_server_clients",
			Help: "Connected delta ADS streams.",
		}, func() float64 { return float64(s.clients.Load()) }),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "xds_server_resources",
			Help: "Resources served, by type URL.",
		}, []string{"url"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_server_pushes_total",
			Help: "Delta responses sent to clients, by type URL.",
		}, []string{"url"}),
		pushed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_server_pushed_resources_total",
			Help: "Resources (upserts and removals) sent to clients, by type URL.",
		}, []string{"url"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_server_nacks_total",
			Help: "Responses clients rejected, by type URL.",
		}, []string{"url"}),
	}
	m := s.metrics
	if err := register(cfg.Registerer, m.clients, m.resources, m.pushes, m.pushed, m.nacks); err != nil {
		log.Error("xds: server metrics unavailable", zap.Error(err))
	}
	return s
}

// SetResources replaces the whole desired set of typeURL (nil: none).
// Streams are answered only once it has been called for both types. Resources whose
// deterministic encoding did not change are left alone; changed, new and
// removed ones are pushed to the connected clients. The Server keeps the
// messages: do not modify them afterwards. A nil or unencodable message is
// logged and keeps its previous version (or stays absent). An unknown type
// URL is logged and ignored.
func (s *Server) SetResources(typeURL string, resources map[string]proto.Message) {
	tc := s.caches[typeURL]
	if tc == nil {
		s.log.Error("xds: SetResources with an unknown type URL", zap.String("type_url", typeURL))
		return
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()

	next := make(map[string]string, len(resources))
	var update map[string]types.Resource
	for name, m := range resources {
		version, err := resourceVersion(m)
		if err != nil {
			s.log.Error("xds: resource not served", zap.String("type_url", typeURL), zap.String("name", name), zap.Error(err))
			if old, ok := tc.versions[name]; ok {
				next[name] = old
			}
			continue
		}
		next[name] = version
		if tc.versions[name] != version {
			if update == nil {
				update = map[string]types.Resource{}
			}
			update[name] = m
		}
	}
	var remove []string
	for name := range tc.versions {
		if _, ok := next[name]; !ok {
			remove = append(remove, name)
		}
	}
	tc.versions = next
	s.metrics.resources.WithLabelValues(typeURL).Set(float64(len(next)))
	if len(update) > 0 || len(remove) > 0 {
		if err := tc.linear.UpdateResources(update, remove); err != nil {
			s.log.Error("xds: notify clients", zap.String("type_url", typeURL), zap.Error(err))
		}
	}
	// Only now that the cache holds the set may held streams proceed.
	if !tc.set {
		tc.set = true
		if int(s.setTypes.Add(1)) == len(s.caches) {
			close(s.ready)
		}
	}
}

// resourceVersion is the version the LinearCache reports for m.
func resourceVersion(m proto.Message) (string, error) {
	if m == nil {
		return "", fmt.Errorf("nil resource")
	}
	b, err := cache.MarshalResource(m)
	if err != nil {
		return "", fmt.Errorf("encode: %w", err)
	}
	return cache.HashResource(b), nil
}

// Versions returns a copy of the served versions (name → version) of
// typeURL, as clients see them.
func (s *Server) Versions(typeURL string) map[string]string {
	tc := s.caches[typeURL]
	if tc == nil {
		return nil
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	out := make(map[string]string, len(tc.versions))
	for k, v := range tc.versions {
		out[k] = v
	}
	return out
}

// Register registers the aggregated discovery service (delta only; the
// state-of-the-world method answers Unimplemented) on g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, adsService{s: s})
}

// Clients returns the number of connected streams.
func (s *Server) Clients() int { return int(s.clients.Load()) }

// Nodes returns the node ids of the connected streams that have sent one,
// sorted (a node that reconnects may briefly appear twice).
func (s *Server) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, st := range s.streams {
		if st.nodeID != "" {
			ids = append(ids, st.nodeID)
		}
	}
	sort.Strings(ids)
	return ids
}

type adsService struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

func (a adsService) DeltaAggregatedResources(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	select {
	case <-a.s.ready:
	case <-st.Context().Done():
		return st.Context().Err()
	}
	return a.s.delta.DeltaStreamHandler(st, resource.AnyType)
}

// callbacks implements go-control-plane's delta.Callbacks.
type callbacks struct{ s *Server }

func (c callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	info := &streamInfo{}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		info.peer = p.Addr.String()
	}
	c.s.mu.Lock()
	c.s.streams[id] = info
	c.s.mu.Unlock()
	c.s.clients.Add(1)
	return nil
}

func (c callbacks) OnDeltaStreamClosed(id int64, node *core.Node) {
	c.s.mu.Lock()
	info := c.s.streams[id]
	delete(c.s.streams, id)
	c.s.mu.Unlock()
	c.s.clients.Add(-1)
	peerAddr := ""
	if info != nil {
		peerAddr = info.peer
	}
	c.s.log.Debug("xds: stream closed", zap.Int64("stream", id), zap.String("node", node.GetId()), zap.String("peer", peerAddr))
}

func (c callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	c.s.mu.Lock()
	info := c.s.streams[id]
	first := false
	if info != nil && info.nodeID == "" && req.GetNode().GetId() != "" {
		info.nodeID = req.GetNode().GetId()
		first = true
	}
	var nodeID, peerAddr string
	if info != nil {
		nodeID, peerAddr = info.nodeID, info.peer
	}
	c.s.mu.Unlock()
	if first {
		c.s.log.Debug("xds: stream opened", zap.Int64("stream", id), zap.String("node", nodeID), zap.String("peer", peerAddr))
	}
	if d := req.GetErrorDetail(); d != nil {
		c.s.metrics.nacks.WithLabelValues(req.GetTypeUrl()).Inc()
		c.s.log.Warn("xds: client rejected resources (NACK)",
			zap.String("node", nodeID),
			zap.String("type_url", req.GetTypeUrl()),
			zap.String("nonce", req.GetResponseNonce()),
			zap.String("message", d.GetMessage()))
	}
	return nil
}

func (c callbacks) OnStreamDeltaResponse(_ int64, _ *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	c.s.metrics.pushes.WithLabelValues(resp.GetTypeUrl()).Inc()
	c.s.metrics.pushed.WithLabelValues(resp.GetTypeUrl()).Add(float64(len(resp.GetResources()) + len(resp.GetRemovedResources())))
}
