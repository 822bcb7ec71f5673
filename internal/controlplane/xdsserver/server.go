package xdsserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/xds/resmap"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// Server invariants:
//   - Each type's resources are an immutable snapshot (name → entry, a
//     resmap.Map) behind an atomic pointer; SetResources and UpdateResources
//     build the next one off to the side, copying only the shards they
//     change, so one changed resource out of 55k costs O(1), not a copy. An
//     entry holds the resource as a discovery.Resource and already encoded as
//     a response's resources entry (server_wire.go), made once per changed
//     resource and shared read-only by every stream's responses, which are
//     written from those bytes rather than marshalled.
//   - version = hex sha256 of the deterministic encoding, so a restarted
//     server gives unchanged resources the versions clients already hold.
//   - SetResources publishes the snapshot first and then marks the changed and
//     removed names pending on every stream. A stream answers pending names
//     from the snapshot it reads then, which is at least as new, and skips
//     names whose version the client already holds, so a late or duplicate
//     mark costs nothing. Work per change is O(changed × streams), never
//     O(all resources × streams).
//   - A stream has at most one unacknowledged response per type; changes that
//     arrive meanwhile accumulate and go out together after the ACK (or NACK).
//   - A stream's "sent" map is what the client holds (initial_resource_versions,
//     then everything sent); only the stream's goroutine touches it. Names the
//     client holds that the server does not have are sent as removals.
//   - Streams are held (not answered) until SetResources has been called for
//     both types: a restarted control plane that answered a reconnecting
//     client before loading its state would tell it to remove everything.
//
// This is our own small delta implementation rather than go-control-plane's
// LinearCache: the LinearCache rescans every resource of the type for every
// wildcard watch on every change and again on every ACK, under one lock
// (measured: ~100 ms for one changed workload out of 1000 to reach 100
// clients), which defeats the push-latency goal.

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
	types   map[string]*typeState // fixed at NewServer
	metrics *serverMetrics

	ready    chan struct{} // closed once every type has been set
	setTypes atomic.Int32  // types set at least once

	streamIDs atomic.Int64
	mu        sync.Mutex
	streams   map[*stream]struct{}
}

type typeState struct {
	mu   sync.Mutex // serializes SetResources and UpdateResources of this type
	snap atomic.Pointer[resmap.Map[*entry]]
	set  bool
	// gated: streams are held until this type has been set (the two
	// workload API types; WaypointType is not gated).
	gated bool
}

func (t *typeState) load() *resmap.Map[*entry] { return t.snap.Load() }

type entry struct {
	version string
	res     *discovery.Resource // read-only once published; its Any's value aliases wire
	wire    mem.Buffer          // the encoded DeltaDiscoveryResponse.resources entry (server_wire.go)
}

// gatedTypes are the workload API's two types: streams are held until both
// have been set (xds.WaypointType is served but not gated).
var gatedTypes = [...]string{xds.AddressType, xds.AuthorizationType}

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
		types:   make(map[string]*typeState, len(gatedTypes)),
		ready:   make(chan struct{}),
		streams: map[*stream]struct{}{},
	}
	for _, t := range gatedTypes {
		ts := &typeState{gated: true}
		ts.snap.Store(resmap.Edit[*entry](nil).Done())
		s.types[t] = ts
	}
	wp := &typeState{}
	wp.snap.Store(resmap.Edit[*entry](nil).Done())
	s.types[xds.WaypointType] = wp
	s.metrics = &serverMetrics{
		clients: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "xds_server_clients",
			Help: "Connected delta ADS streams.",
		}, func() float64 { return float64(s.Clients()) }),
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
	if err := xds.RegisterMetrics(cfg.Registerer, m.clients, m.resources, m.pushes, m.pushed, m.nacks); err != nil {
		log.Error("server metrics unavailable", zap.Error(err))
	}
	return s
}

// SetResources replaces the whole desired set of typeURL (nil: none).
// Streams are answered only once it has been called for both types.
// Resources whose deterministic encoding did not change are left alone;
// changed, new and removed ones are pushed to the connected clients. A nil or
// unencodable message is logged and keeps its previous version (or stays
// absent). An unknown type URL is logged and ignored.
func (s *Server) SetResources(typeURL string, resources map[string]proto.Message) {
	s.update(typeURL, resources, nil, true)
}

// UpdateResources changes part of typeURL's set: upserts are added or
// replaced (an unchanged encoding keeps its version and is not pushed),
// removed names are dropped. The rest of the set stays as it is, so the
// cost is proportional to the change. Errors are handled as in
// SetResources; a type is "set" for the readiness gate only by SetResources.
func (s *Server) UpdateResources(typeURL string, upserts map[string]proto.Message, removed []string) {
	s.update(typeURL, upserts, removed, false)
}

func (s *Server) update(typeURL string, resources map[string]proto.Message, removed []string, whole bool) {
	ts := s.types[typeURL]
	if ts == nil {
		s.log.Error("SetResources with an unknown type URL", zap.String("type_url", typeURL))
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()

	prev := ts.load()
	e := resmap.Edit(prev)
	var changed []string
	var b []byte // each encoding in turn: newEntry copies it
	for name, m := range resources {
		var err error
		b, err = encode(b[:0], m)
		if err != nil {
			s.log.Error("resource not served", zap.String("type_url", typeURL), zap.String("name", name), zap.Error(err))
			continue // keeps its previous entry, if any
		}
		version := resourceVersion(b)
		if old, ok := prev.Get(name); ok && old.version == version {
			continue
		}
		e.Set(name, newEntry(typeURL, name, version, b))
		changed = append(changed, name)
	}
	if whole {
		for name := range prev.All() {
			if _, ok := resources[name]; !ok {
				removed = append(removed, name)
			}
		}
	}
	for _, name := range removed {
		if _, ok := prev.Get(name); ok {
			e.Delete(name)
			changed = append(changed, name)
		}
	}
	next := e.Done()
	s.metrics.resources.WithLabelValues(typeURL).Set(float64(next.Len()))
	if len(changed) > 0 {
		ts.snap.Store(next)
		s.mu.Lock()
		for st := range s.streams {
			st.markPending(typeURL, changed)
		}
		s.mu.Unlock()
	}
	// Only now that the snapshot holds the set may held streams proceed.
	if whole && !ts.set {
		ts.set = true
		if ts.gated && int(s.setTypes.Add(1)) == len(gatedTypes) {
			close(s.ready)
		}
	}
}

// encode appends m's deterministic encoding to buf.
func encode(buf []byte, m proto.Message) ([]byte, error) {
	if m == nil {
		return buf, errors.New("nil resource")
	}
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(buf, m)
	if err != nil {
		return buf, fmt.Errorf("encode: %w", err)
	}
	return b, nil
}

// resourceVersion is the version of an encoded resource.
func resourceVersion(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Versions returns a copy of the served versions (name → version) of
// typeURL, as clients see them.
func (s *Server) Versions(typeURL string) map[string]string {
	ts := s.types[typeURL]
	if ts == nil {
		return nil
	}
	snap := ts.load()
	out := make(map[string]string, snap.Len())
	for k, e := range snap.All() {
		out[k] = e.version
	}
	return out
}

// Register registers the aggregated discovery service (delta only; the
// state-of-the-world method answers Unimplemented) on g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, adsService{s: s})
}

// Clients returns the number of connected streams.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// Nodes returns the node ids of the connected streams that have sent one,
// sorted (a node that reconnects may briefly appear twice).
func (s *Server) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for st := range s.streams {
		if id := st.nodeID.Load(); id != nil {
			ids = append(ids, *id)
		}
	}
	sort.Strings(ids)
	return ids
}

type adsService struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

func (a adsService) DeltaAggregatedResources(gs discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	select {
	case <-a.s.ready:
	case <-gs.Context().Done():
		return gs.Context().Err()
	}
	st := &stream{
		s:     a.s,
		gs:    gs,
		id:    a.s.streamIDs.Add(1),
		wake:  make(chan struct{}, 1),
		subs:  map[string]*subscription{},
		dirty: map[string]map[string]struct{}{},
	}
	st.status.connected = time.Now()
	if p, ok := peer.FromContext(gs.Context()); ok && p.Addr != nil {
		st.peer = p.Addr.String()
	}
	a.s.mu.Lock()
	a.s.streams[st] = struct{}{}
	a.s.mu.Unlock()
	defer func() {
		a.s.mu.Lock()
		delete(a.s.streams, st)
		a.s.mu.Unlock()
	}()
	err := st.run()
	a.s.log.Debug("stream closed", st.fields(zap.Error(err))...)
	return err
}

// stream is one client's delta ADS stream.
type stream struct {
	s      *Server
	gs     discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	id     int64
	peer   string
	nodeID atomic.Pointer[string]

	wake chan struct{} // cap 1: pending names were marked

	status streamStatus // what Server.Status reports; its own lock

	mu    sync.Mutex
	dirty map[string]map[string]struct{} // type URL → names to reconsider; guarded by mu

	// Owned by the run goroutine.
	subs  map[string]*subscription
	nonce int64
}

// subscription is the state of one type on a stream.
type subscription struct {
	wildcard bool
	names    map[string]struct{} // explicit subscriptions (besides wildcard)
	sent     map[string]string   // what the client holds: name → version
	inflight string              // nonce of the unacknowledged response; "": none
}

func (sub *subscription) wants(name string) bool {
	if sub.wildcard {
		return true
	}
	_, ok := sub.names[name]
	return ok
}

func (st *stream) fields(extra ...zap.Field) []zap.Field {
	node := ""
	if id := st.nodeID.Load(); id != nil {
		node = *id
	}
	return append([]zap.Field{zap.Int64("stream", st.id), zap.String("node", node), zap.String("peer", st.peer)}, extra...)
}

// markPending records changed names of typeURL and wakes the stream.
func (st *stream) markPending(typeURL string, names []string) {
	st.mu.Lock()
	d := st.dirty[typeURL]
	if d == nil {
		d = make(map[string]struct{}, len(names))
		st.dirty[typeURL] = d
	}
	for _, n := range names {
		d[n] = struct{}{}
	}
	st.mu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

func (st *stream) run() error {
	ctx := st.gs.Context()
	reqs := make(chan *discovery.DeltaDiscoveryRequest)
	recvErr := make(chan error, 1)
	go func() {
		for {
			req, err := st.gs.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case req := <-reqs:
			if err := st.handleRequest(req); err != nil {
				return err
			}
		case <-st.wake:
		}
		if err := st.flush(); err != nil {
			return err
		}
	}
}

// handleRequest applies a client request: a new subscription, an ACK/NACK,
// or a change of subscribed names.
func (st *stream) handleRequest(req *discovery.DeltaDiscoveryRequest) error {
	typeURL := req.GetTypeUrl()
	if typeURL == "" {
		return status.Error(codes.InvalidArgument, "xds: request without type_url")
	}
	if st.nodeID.Load() == nil && req.GetNode().GetId() != "" {
		id := req.GetNode().GetId()
		st.nodeID.Store(&id)
		md := map[string]string{}
		for k, v := range req.GetNode().GetMetadata().GetFields() {
			md[k] = v.GetStringValue()
		}
		st.status.noteNode(md)
		st.s.log.Debug("stream opened", st.fields()...)
	}
	sub := st.subs[typeURL]
	if sub == nil {
		// First request of this type on the stream: compare everything the
		// client holds with the snapshot.
		sub = &subscription{names: map[string]struct{}{}}
		sub.wildcard = len(req.GetResourceNamesSubscribe()) == 0
		initial := req.GetInitialResourceVersions()
		if sub.wildcard {
			// It will hold the whole snapshot: size it once (a full
			// sync of 110k names otherwise regrows it ~17 times).
			sub.sent = make(map[string]string, max(st.snapshot(typeURL).Len(), len(initial)))
			maps.Copy(sub.sent, initial)
		} else {
			sub.sent = maps.Clone(initial)
			if sub.sent == nil {
				sub.sent = map[string]string{}
			}
		}
		st.subs[typeURL] = sub
		st.updateNames(sub, req)
		st.status.noteSubscription(typeURL, sub)
		// A wildcard client is compared with every resource; a client
		// that subscribed to names only with those (an on-demand node
		// holds ~1 % of a large mesh).
		var all []string
		if sub.wildcard {
			snap := st.snapshot(typeURL)
			all = make([]string, 0, snap.Len()+len(sub.sent))
			for n := range snap.All() {
				all = append(all, n)
			}
		} else {
			all = make([]string, 0, len(sub.names)+len(sub.sent))
			for n := range sub.names {
				all = append(all, n)
			}
		}
		for n := range sub.sent {
			all = append(all, n)
		}
		return st.respond(typeURL, sub, all, true)
	}
	if nonce := req.GetResponseNonce(); nonce != "" && nonce == sub.inflight {
		sub.inflight = ""
		st.status.noteReply(typeURL, nonce, req.GetErrorDetail() != nil, req.GetErrorDetail().GetMessage(), time.Now())
		if d := req.GetErrorDetail(); d != nil {
			st.s.metrics.nacks.WithLabelValues(typeURL).Inc()
			st.s.log.Warn("client rejected resources (NACK)", st.fields(
				zap.String("type_url", typeURL), zap.String("nonce", nonce), zap.String("message", d.GetMessage()))...)
		}
	}
	if added := st.updateNames(sub, req); len(added) > 0 {
		st.markPending(typeURL, added)
	}
	st.status.noteSubscription(typeURL, sub)
	return nil
}

// updateNames applies resource_names_(un)subscribe and returns the names
// that became wanted. Unsubscribed names are forgotten without a removal,
// as the protocol allows.
func (st *stream) updateNames(sub *subscription, req *discovery.DeltaDiscoveryRequest) []string {
	var added []string
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			sub.wildcard = true
			continue
		}
		sub.names[n] = struct{}{}
		added = append(added, n)
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			sub.wildcard = false
			continue
		}
		delete(sub.names, n)
		if !sub.wildcard {
			delete(sub.sent, n)
		}
	}
	return added
}

func (st *stream) snapshot(typeURL string) *resmap.Map[*entry] {
	if ts := st.s.types[typeURL]; ts != nil {
		return ts.load()
	}
	return nil // a type we do not serve: always empty
}

// flush sends the pending names of every subscribed type that has no
// response in flight. Names pending for a type the client has not subscribed
// to are dropped: its first request compares the whole snapshot anyway.
func (st *stream) flush() error {
	type work struct {
		typeURL string
		sub     *subscription
		names   []string
	}
	var todo []work
	st.mu.Lock()
	for typeURL, d := range st.dirty {
		sub := st.subs[typeURL]
		if sub != nil && sub.inflight != "" {
			continue
		}
		delete(st.dirty, typeURL)
		if sub == nil || len(d) == 0 {
			continue
		}
		w := work{typeURL: typeURL, sub: sub, names: make([]string, 0, len(d))}
		for n := range d {
			w.names = append(w.names, n)
		}
		todo = append(todo, w)
	}
	st.mu.Unlock()
	for _, w := range todo {
		if err := st.respond(w.typeURL, w.sub, w.names, false); err != nil {
			return err
		}
	}
	return nil
}

// respond sends what differs between the snapshot and the client for names.
// always: send even when nothing differs (the answer to a first request).
func (st *stream) respond(typeURL string, sub *subscription, names []string, always bool) error {
	snap := st.snapshot(typeURL)
	resp := &response{typeURL: typeURL}
	// names may repeat (a first request lists the snapshot's names and then
	// the client's): a repeat finds sub.sent already updated and adds nothing.
	for _, n := range names {
		e, ok := snap.Get(n)
		held, holds := sub.sent[n]
		switch {
		case ok && sub.wants(n):
			if !holds || held != e.version {
				resp.resources = append(resp.resources, e)
				sub.sent[n] = e.version
			}
		case holds:
			resp.removed = append(resp.removed, n)
			delete(sub.sent, n)
		}
	}
	if !always && len(resp.resources) == 0 && len(resp.removed) == 0 {
		return nil
	}
	st.nonce++
	resp.nonce = strconv.FormatInt(st.nonce, 10)
	sub.inflight = resp.nonce
	var err error
	if wireCodecActive() {
		err = st.gs.SendMsg(resp.wire())
	} else {
		err = st.gs.Send(resp.message())
	}
	if err != nil {
		return err
	}
	st.status.noteSent(typeURL, resp.nonce, sub, time.Now())
	st.s.metrics.pushes.WithLabelValues(typeURL).Inc()
	st.s.metrics.pushed.WithLabelValues(typeURL).Add(float64(len(resp.resources) + len(resp.removed)))
	return nil
}
