// Package controlplane is ztunnel-go's embeddable control plane: it runs a
// cluster.Source, re-translates the objects on every change (debounced),
// pushes the resulting Addresses and Authorizations to an xDS server, and
// serves that xDS server and the certificate service on one TLS gRPC
// listener (Istio's port 15012). The binary cmd/ztunnel-cp wires it; a
// node proxy can embed it in-process for the local mesh.
//
// The deciding lives in subpackages: translate (objects → resources),
// autoalloc (ServiceEntry addresses), caserver (certificates and caller
// authentication). This package only sequences them and reports what
// happened (ConfigDump). It does not talk to the Kubernetes API itself: in
// Kubernetes mode cmd/ztunnel-cp hands it the API-backed parts (the
// cluster/kube Source, kubeauth's Authenticator and live Placement,
// kubestatus as the allocator's Store).
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/xdsserver"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// DefaultDebounce is how long the controller waits after a change for more
// changes before translating.
const DefaultDebounce = 10 * time.Millisecond

// Config configures a ControlPlane.
type Config struct {
	// Source of cluster objects. Required. Run starts it.
	Source cluster.Source
	// SourceErrors returns the source's current problems (bad documents with
	// file, index and field) for ConfigDump. nil: none reported.
	SourceErrors func() []error
	// Translate holds the mesh settings; its zero string fields take the
	// translate defaults. Local mode wants translate.LocalDefaults().
	Translate translate.Config
	// Allocator assigns ServiceEntry addresses. nil: an in-memory allocator
	// with the default ranges (addresses do not survive a restart).
	Allocator *autoalloc.Allocator
	// CA signs workload certificates. Required.
	CA *ca.CA
	// Auth authenticates node proxies on xDS and on the CA. Required.
	Auth caserver.Authenticator
	// Placement answers the CA's "does ns/sa run on node N?". nil: the
	// latest translation's pods (CachedPlacement), which is all local mode
	// has; Kubernetes mode passes a live check against the API server
	// (kubeauth.Placement) that consults CachedPlacement first.
	Placement caserver.Placement
	// ServingNames are the DNS names and IPs of the TLS serving certificate.
	// nil: caserver.DefaultServingNames(root namespace) plus the listener's IP.
	ServingNames []string
	// Debounce: 0 means DefaultDebounce.
	Debounce time.Duration
	// PolicyStatus, when set, is handed every translation's objects and
	// policy statuses (after the waypoint configs' update), so that they
	// can be written into the objects' status (kubestatus.IstioWriter). It
	// must not block.
	PolicyStatus func(objs *cluster.Objects, policies []translate.PolicyStatus)
	// Remotes, when set, lists the remote clusters of a multi-primary mesh
	// (internal/controlplane/multicluster): their workloads are merged into
	// the global services (translate.Merger), and a change of theirs
	// translates again like a change of Source. nil: this cluster only.
	Remotes RemoteSource
	// Log: nil means no logging.
	Log *zap.Logger
	// Registerer receives the xDS server and controlplane_* metrics. nil: not registered.
	Registerer prometheus.Registerer
}

// RemoteSource publishes the remote clusters to merge. If it also has a
// method Report() []string, its lines go to the config dump
// (RemoteClusters).
type RemoteSource interface {
	// Current returns the clusters (nil: none) and a channel closed when
	// they change. It must not block.
	Current() ([]translate.RemoteCluster, <-chan struct{})
}

// snapshot is one translation, immutable once published.
type snapshot struct {
	generation uint64
	objs       *cluster.Objects
	result     *translate.Result
	allocErr   error
	// onNode: node → set of "ns/sa" with a live pod on it.
	onNode map[string]map[string]bool
}

// ControlPlane is one running control plane. Create it with New.
type ControlPlane struct {
	cfg  Config
	log  *zap.Logger
	xds  *xdsserver.Server
	ca   *caserver.Server
	snap atomic.Pointer[snapshot]

	syncedOnce sync.Once
	synced     chan struct{}

	// Owned by the goroutine calling Apply (the loop):
	tr        *translate.Translator
	mc        *translate.Merger         // nil without Remotes
	placeRefs map[string]map[string]int // node → "ns/sa" → live pods
	warned    map[string]bool           // warnings already logged
	lastWarns []string                  // the Warnings slice warned was computed from
	// wps and wpsPolicies are the last WaypointConfigs result (wpsDone:
	// computed at least once).
	wps         map[string]*waypointapi.Config
	wpsPolicies []translate.PolicyStatus
	wpsDone     bool
	// keysChanged: a key set the waypoints' JWT rules name was fetched
	// (translate.Config.JWKS): rebuild the waypoint configs.
	keysChanged bool
	// ignoredSeen: ignored objects already logged (reportIgnored).
	ignoredSeen map[string]bool
	// invalidSeen: invalid policy values already logged (reportInvalid).
	invalidSeen map[string]bool

	translations prometheus.Counter
	warnings     prometheus.Gauge
}

// New validates cfg and builds the control plane; nothing runs until Run.
func New(cfg Config) (*ControlPlane, error) {
	if cfg.Source == nil || cfg.CA == nil || cfg.Auth == nil {
		return nil, errors.New("controlplane: Source, CA and Auth are required")
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Allocator == nil {
		a, err := autoalloc.New(autoalloc.Config{})
		if err != nil {
			return nil, err
		}
		cfg.Allocator = a
	}
	c := &ControlPlane{
		cfg:    cfg,
		log:    log,
		synced: make(chan struct{}),
		warned: map[string]bool{},
		tr:     translate.NewTranslator(cfg.Translate),
		translations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controlplane_translations_total", Help: "Translations of the cluster objects into mesh resources.",
		}),
		warnings: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "controlplane_translation_warnings", Help: "Warnings of the latest translation (see the config dump).",
		}),
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{c.translations, c.warnings} {
			if err := cfg.Registerer.Register(m); err != nil {
				log.Warn("metric not registered", zap.Error(err))
			}
		}
	}
	if cfg.Remotes != nil {
		c.mc = translate.NewMerger(cfg.Translate)
	}
	c.xds = xdsserver.NewServer(xdsserver.ServerConfig{Log: log.Named("xds"), Registerer: cfg.Registerer})
	placement := cfg.Placement
	if placement == nil {
		placement = c.CachedPlacement()
	}
	srv, err := caserver.New(caserver.Config{
		CA: cfg.CA, Auth: cfg.Auth, Placement: placement, Log: log.Named("ca"),
	})
	if err != nil {
		return nil, err
	}
	c.ca = srv
	return c, nil
}

// CachedPlacement answers the CA's placement question from the latest
// translation's pods: fast, but a pod scheduled a moment ago may be missing
// until the source delivers it. It is the default Placement.
func (c *ControlPlane) CachedPlacement() caserver.Placement { return caserver.PlacementFunc(c.onNode) }

// onNode answers the CA's placement question from the latest translation.
func (c *ControlPlane) onNode(node, ns, sa string) bool {
	s := c.snap.Load()
	return s != nil && s.onNode[node][ns+"/"+sa]
}

// Synced is closed once the first translation has been pushed to the xDS
// server (node proxies are answered only from then on).
func (c *ControlPlane) Synced() <-chan struct{} { return c.synced }

// RootPEM is the trust bundle node proxies need to verify the server and
// the certificates it issues.
func (c *ControlPlane) RootPEM() []byte { return c.cfg.CA.RootPEM() }

// Result returns the latest translation, or nil before the first one.
func (c *ControlPlane) Result() *translate.Result {
	if s := c.snap.Load(); s != nil {
		return s.result
	}
	return nil
}

// XDS returns the xDS server (for its Nodes and Versions).
func (c *ControlPlane) XDS() *xdsserver.Server { return c.xds }

// NewGRPCServer returns a gRPC server with TLS (tlsCfg), the authenticating
// interceptors, ADS and the CA registered: what Run serves. Embedders that
// run their own listener use it directly.
func (c *ControlPlane) NewGRPCServer(tlsCfg *tls.Config) *grpc.Server {
	g := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.UnaryInterceptor(caserver.UnaryInterceptor(c.cfg.Auth, c.log.Named("auth"))),
		grpc.StreamInterceptor(caserver.StreamInterceptor(c.cfg.Auth, c.log.Named("auth"))),
	)
	c.xds.Register(g)
	c.ca.Register(g)
	return g
}

// TLSConfig issues the serving certificate for the configured names (plus
// the listener's address) and returns the server TLS configuration.
func (c *ControlPlane) TLSConfig(lis net.Addr) (*tls.Config, error) {
	names := c.cfg.ServingNames
	if names == nil {
		names = caserver.DefaultServingNames(c.rootNamespace())
		if ta, ok := lis.(*net.TCPAddr); ok && !ta.IP.IsUnspecified() {
			names = append(names, ta.IP.String())
		}
	}
	cert, err := caserver.ServingCertificate(c.cfg.CA, names, 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func (c *ControlPlane) rootNamespace() string {
	if c.cfg.Translate.RootNamespace != "" {
		return c.cfg.Translate.RootNamespace
	}
	return translate.DefaultRootNamespace
}

// Run runs the source, the translation loop and the gRPC server on lis
// until ctx is done, then stops gracefully. It returns the first fatal error
// (the source failing to start, the server failing). lis is closed on return.
func (c *ControlPlane) Run(ctx context.Context, lis net.Listener) error {
	tlsCfg, err := c.TLSConfig(lis.Addr())
	if err != nil {
		lis.Close()
		return err
	}
	srv := c.NewGRPCServer(tlsCfg)
	// The server stops first (its streams end gracefully), then the
	// translation loop, then the source.
	g := daemon.NewGroup(ctx, c.log)
	g.Go("cluster source", func(ctx context.Context) error {
		if err := c.cfg.Source.Run(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("controlplane: source: %w", err)
		}
		return nil
	})
	g.Go("translation", func(ctx context.Context) error { c.loop(ctx); return nil })
	g.Go("grpc server", func(context.Context) error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("controlplane: serve %s: %w", lis.Addr(), err)
		}
		return nil
	}, daemon.OnStop(func() { stopGracefully(srv, 5*time.Second) }))
	c.log.Info("control plane serving xDS and CA", zap.Stringer("addr", lis.Addr()))
	return g.Wait()
}

// stopGracefully ends the xDS streams (they never finish on their own)
// after giving unary calls up to d.
func stopGracefully(g *grpc.Server, d time.Duration) {
	hard := time.AfterFunc(d, g.Stop) // GracefulStop returns once Stop ends the streams
	g.GracefulStop()
	hard.Stop()
}

// loop re-translates whenever the source publishes, waiting Debounce after
// a change so a burst of changes costs one translation.
func (c *ControlPlane) loop(ctx context.Context) {
	var last *cluster.Objects
	var lastRemotes []translate.RemoteCluster
	var remotesChanged <-chan struct{} // nil: never
	var keys <-chan struct{}           // nil: never
	if k, ok := c.cfg.Translate.JWKS.(interface{ Changed() <-chan struct{} }); ok {
		keys = k.Changed()
	}
	for {
		objs, changed := c.cfg.Source.Current()
		var remotes []translate.RemoteCluster
		if c.cfg.Remotes != nil {
			remotes, remotesChanged = c.cfg.Remotes.Current()
		}
		if objs != nil && (objs != last || !slices.Equal(remotes, lastRemotes)) {
			c.apply(objs, remotes)
			last, lastRemotes = objs, remotes
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-remotesChanged:
		case <-c.cfg.Allocator.Changed():
			// Leadership changed: allocate again for the same objects.
			if last != nil {
				c.apply(last, lastRemotes)
			}
			continue
		case <-keys:
			// A JWKS fetch finished: the same objects, new keys for the
			// waypoints (and the RequestAuthentications' status).
			if last != nil {
				c.keysChanged = true
				c.apply(last, lastRemotes)
			}
			continue
		}
		t := time.NewTimer(c.cfg.Debounce)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Apply translates objs and pushes the result now. Run calls it for every
// change of the source; tests and embedders may call it directly. Calls
// must not run concurrently. The translation is incremental
// (translate.Translator): a pod change costs that pod's workload, and only
// the resources that changed are handed to the xDS server. The remote
// clusters merged are Remotes' current ones.
func (c *ControlPlane) Apply(objs *cluster.Objects) {
	var remotes []translate.RemoteCluster
	if c.cfg.Remotes != nil {
		remotes, _ = c.cfg.Remotes.Current()
	}
	c.apply(objs, remotes)
}

func (c *ControlPlane) apply(objs *cluster.Objects, remotes []translate.RemoteCluster) {
	start := time.Now()
	allocs, allocErr := c.cfg.Allocator.Allocate(objs.ServiceEntries)
	if allocErr != nil {
		c.log.Warn("ServiceEntry address allocation incomplete", zap.Error(allocErr))
	}
	before := c.tr.Result()
	res, ch := c.tr.Update(objs, allocs)
	if c.mc != nil {
		// Remote workloads never hold a waypoint (WaypointConfigsAffected) nor a
		// placement: PodChanges stay this cluster's.
		res, ch = c.mc.Merge(res, ch, objs, remotes)
	}
	// Waypoint configs (ours, issue 14): only those a change can touch
	// are rebuilt (translate.WaypointConfigsAffected); the xDS server
	// pushes only changed ones. A pod change that binds nothing to a
	// waypoint, or a namespace label flip that changes no bound address,
	// no waypoint and no policy status, keeps them all; one that changes
	// what is bound to some waypoints rebuilds theirs, or all of them
	// when the statuses gather every config (UpdateWaypointConfigs).
	wc := translate.WaypointChange{All: true}
	if c.wpsDone && !c.keysChanged {
		wc = translate.WaypointConfigsAffected(before, res, objs, ch)
	}
	c.keysChanged = false
	wpsChanged, wpsWhole := !wc.None(), true
	prevWps := c.wps
	if wpsChanged {
		if wps, st, ok := translate.UpdateWaypointConfigs(c.cfg.Translate, objs, res, c.wps, wc); ok {
			c.wps, c.wpsPolicies, wpsWhole = wps, st, false
		} else {
			c.wps, c.wpsPolicies = translate.WaypointConfigs(c.cfg.Translate, objs, res)
		}
		c.wpsDone = true
	}
	if wpStatus := c.wpsPolicies; wpStatus != nil {
		r := *res
		r.Policies = wpStatus
		res = &r
	}
	prev := c.snap.Load()
	gen := uint64(1)
	if prev != nil {
		gen = prev.generation + 1
	}
	var onNode map[string]map[string]bool
	if ch.Full || prev == nil {
		c.placeRefs, onNode = placement(objs)
	} else {
		onNode = c.updatePlacement(prev.onNode, ch.PodChanges)
	}
	s := &snapshot{generation: gen, objs: objs, result: res, allocErr: allocErr, onNode: onNode}

	// Publish the placement before the workloads: a node proxy that learns
	// of a new workload may ask for its certificate right away.
	c.snap.Store(s)
	switch {
	case ch.Full:
		authz := make(map[string]proto.Message, len(res.Authorizations))
		for k, v := range res.Authorizations {
			authz[k] = v
		}
		c.xds.SetResources(xds.AuthorizationType, authz)
	case ch.Global:
		// Policies are translated as a whole (translate.Changes.Global),
		// but an unchanged policy keeps its Authorization: hand the server
		// only those that are new objects (it sends only changed
		// encodings) and the names that are gone.
		up := map[string]proto.Message{}
		for k, v := range res.Authorizations {
			if before.Authorizations[k] != v {
				up[k] = v
			}
		}
		var gone []string
		for k := range before.Authorizations {
			if _, ok := res.Authorizations[k]; !ok {
				gone = append(gone, k)
			}
		}
		c.xds.UpdateResources(xds.AuthorizationType, up, gone)
	}
	if ch.Full {
		addrs := make(map[string]proto.Message, res.Addresses.Len())
		for k, v := range res.Addresses.All() {
			addrs[k] = v
		}
		c.xds.SetResources(xds.AddressType, addrs)
	} else {
		up := make(map[string]proto.Message, len(ch.Addresses))
		for k, v := range ch.Addresses {
			up[k] = v
		}
		c.xds.UpdateResources(xds.AddressType, up, ch.Removed)
	}
	switch {
	case wpsChanged && wpsWhole:
		wpm := make(map[string]proto.Message, len(c.wps))
		for k, v := range c.wps {
			wpm[k] = v
		}
		c.xds.SetResources(xds.WaypointType, wpm)
	case wpsChanged:
		// Only the configs rebuilt (new objects) and those gone.
		up := map[string]proto.Message{}
		for k, v := range c.wps {
			if prevWps[k] != v {
				up[k] = v
			}
		}
		var gone []string
		for k := range prevWps {
			if _, ok := c.wps[k]; !ok {
				gone = append(gone, k)
			}
		}
		c.xds.UpdateResources(xds.WaypointType, up, gone)
	}
	c.syncedOnce.Do(func() { close(c.synced) })

	c.reportIgnored(objs.Ignored)
	c.reportInvalid(res)
	if c.cfg.PolicyStatus != nil {
		c.cfg.PolicyStatus(objs, res.Policies)
	}
	if !sameSlice(res.Warnings, c.lastWarns) {
		current := map[string]bool{}
		for _, w := range res.Warnings {
			current[w] = true
			if !c.warned[w] {
				c.log.Warn("translation warning", zap.String("warning", w))
			}
		}
		c.warned, c.lastWarns = current, res.Warnings
	}
	c.translations.Inc()
	c.warnings.Set(float64(len(res.Warnings)))
	fields := []zap.Field{zap.Uint64("generation", gen), zap.Bool("full", ch.Full),
		zap.Int("addresses", res.Addresses.Len()), zap.Int("authorizations", len(res.Authorizations)),
		zap.Int("warnings", len(res.Warnings)), zap.Int("pods_translated", ch.Pods),
		zap.Int("services_translated", ch.Services), zap.Duration("took", time.Since(start))}
	if ch.Full || ch.Global {
		c.log.Info("translated cluster objects", append(fields, zap.String("reason", ch.Reason))...)
	} else {
		c.log.Debug("translated changed objects", append(fields, zap.Int("pushed", len(ch.Addresses)+len(ch.Removed)))...)
	}
}

// sameSlice reports whether a and b are the same slice (translate.Result
// reuses its Warnings slice while the warnings do not change).
func sameSlice(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func placementKey(p *corev1.Pod) (node, nsSA string, ok bool) {
	if p == nil || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return "", "", false
	}
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return p.Spec.NodeName, p.Namespace + "/" + sa, true
}

// placement indexes which service accounts have a live pod on which node:
// the reference counts Apply keeps, and the published set.
func placement(objs *cluster.Objects) (map[string]map[string]int, map[string]map[string]bool) {
	refs := map[string]map[string]int{}
	out := map[string]map[string]bool{}
	for _, p := range objs.Pods {
		node, k, ok := placementKey(p)
		if !ok {
			continue
		}
		if refs[node] == nil {
			refs[node], out[node] = map[string]int{}, map[string]bool{}
		}
		refs[node][k]++
		out[node][k] = true
	}
	return refs, out
}

// updatePlacement applies pod changes to the reference counts and returns
// the next published set, sharing the nodes that did not change with prev.
func (c *ControlPlane) updatePlacement(prev map[string]map[string]bool, changes []translate.PodChange) map[string]map[string]bool {
	touched := map[string]bool{}
	for _, pc := range changes {
		if node, k, ok := placementKey(pc.Old); ok {
			if c.placeRefs[node][k]--; c.placeRefs[node][k] <= 0 {
				delete(c.placeRefs[node], k)
			}
			touched[node] = true
		}
		if node, k, ok := placementKey(pc.New); ok {
			if c.placeRefs[node] == nil {
				c.placeRefs[node] = map[string]int{}
			}
			c.placeRefs[node][k]++
			touched[node] = true
		}
	}
	if len(touched) == 0 {
		return prev
	}
	next := maps.Clone(prev)
	for node := range touched {
		if len(c.placeRefs[node]) == 0 {
			delete(next, node)
			delete(c.placeRefs, node)
			continue
		}
		set := make(map[string]bool, len(c.placeRefs[node]))
		for k := range c.placeRefs[node] {
			set[k] = true
		}
		next[node] = set
	}
	return next
}
