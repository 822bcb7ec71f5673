// Package kube is the Kubernetes cluster source. It watches the kinds of
// cluster.Kinds that Config asks for, each through the typed shared
// informers of the clientset its API group belongs to: client-go for
// Kubernetes' own kinds, istio.io/client-go for the *.istio.io groups and
// sigs.k8s.io/gateway-api for Gateway API. After every change, debounced,
// it publishes a new immutable cluster.Objects built from the informer
// caches, so the control plane runs the same translation as in local mode
// and the node agent sees the same objects.
//
// Current is nil until every informer has synced once. When the API server
// goes away the informers re-list and re-watch on their own; the last
// published Objects keep serving meanwhile.
//
// It does not write anything to the API server (see
// internal/controlplane/kubestatus and cni/agent/kube) and does not
// translate anything (see internal/controlplane/translate).
package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gatewayinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// Kind names one watched object type (the Kubernetes kind).
type Kind string

// The kinds a Source can watch.
const (
	Namespaces            Kind = "Namespace"
	Pods                  Kind = "Pod"
	Services              Kind = "Service"
	EndpointSlices        Kind = "EndpointSlice"
	ServiceEntries        Kind = "ServiceEntry"
	WorkloadEntries       Kind = "WorkloadEntry"
	AuthorizationPolicies Kind = "AuthorizationPolicy"
	PeerAuthentications   Kind = "PeerAuthentication"
	Gateways              Kind = "Gateway"
	GatewayClasses        Kind = "GatewayClass"
	Nodes                 Kind = "Node"
	Secrets               Kind = "Secret"
)

// secretSelector is the field selector of the Secrets informer.
const secretSelector = "type!=kubernetes.io/service-account-token,type!=helm.sh/release.v1"

// AllKinds is every kind the control plane translates: every kind of
// cluster.Kinds.
func AllKinds() []Kind {
	var out []Kind
	for _, k := range cluster.Kinds() {
		out = append(out, Kind(k.Name))
	}
	return out
}

// AgentKinds is what the node agent needs: namespaces and pods.
func AgentKinds() []Kind { return []Kind{Namespaces, Pods} }

// DefaultDebounce is how long a Source waits after a change for more
// changes before it publishes.
const DefaultDebounce = 50 * time.Millisecond

// syncLogInterval spaces the "still waiting for informers" log lines.
const syncLogInterval = 10 * time.Second

// Clients are the typed clientsets a Source reads through.
type Clients struct {
	Kube    kubernetes.Interface
	Istio   istioclient.Interface
	Gateway gatewayclient.Interface
	// Metadata reads objects' metadata only: kinds watched just to be
	// reported (Config.WatchIgnored). May be nil otherwise.
	Metadata metadata.Interface
}

// NewClients builds the clientsets from one REST configuration.
func NewClients(rc *rest.Config) (*Clients, error) {
	k, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: client: %w", err)
	}
	i, err := istioclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: istio client: %w", err)
	}
	g, err := gatewayclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: gateway client: %w", err)
	}
	m, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: metadata client: %w", err)
	}
	return &Clients{Kube: k, Istio: i, Gateway: g, Metadata: m}, nil
}

// RESTConfig loads a kubeconfig file, or the in-cluster configuration (the
// pod's service account) when kubeconfig is "".
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kube: in-cluster configuration (pass --kubeconfig outside a pod): %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kube: kubeconfig %s: %w", kubeconfig, err)
	}
	return rc, nil
}

// Config configures New.
type Config struct {
	// Clients to read through. Required; Istio may be nil when no Istio
	// kind is watched, Gateway when no Gateway API kind is.
	Clients *Clients
	// Kinds to watch; nil means AllKinds. Unwatched kinds stay empty in
	// the published Objects.
	Kinds []Kind
	// NodeName, if set, restricts Pods to spec.nodeName=NodeName (a field
	// selector evaluated by the API server): the node agent's view.
	NodeName string
	// WatchIgnored also watches, metadata only, the kinds the control plane
	// does not read (cluster.IgnoredKinds: Sidecar, Telemetry, EnvoyFilter,
	// WasmPlugin, ...) that the API server serves, so that each object of
	// them is reported. They never hold back Synced. Needs Clients.Metadata.
	WatchIgnored bool
	// Debounce: 0 means DefaultDebounce.
	Debounce time.Duration
	// Log: nil means no logging.
	Log *zap.Logger
}

// watched is one informer and its kind.
type watched struct {
	kind     Kind
	informer cache.SharedIndexInformer
}

// Source is the Kubernetes cluster.Source. Create it with New, then Run.
type Source struct {
	cfg      Config
	log      *zap.Logger
	watched  []watched
	starters []func(stop <-chan struct{})
	stoppers []func()

	ignored ignoredSet

	kick    chan struct{}
	events  atomic.Uint64 // changes seen by the informer handlers
	running atomic.Bool

	mu        sync.Mutex
	cur       *cluster.Objects
	changed   chan struct{}
	synced    chan struct{}
	published uint64 // events count of cur
}

// New validates cfg and sets the informers up; nothing is contacted before Run.
func New(cfg Config) (*Source, error) {
	if cfg.Clients == nil || cfg.Clients.Kube == nil {
		return nil, errors.New("kube: Config.Clients.Kube is required")
	}
	if cfg.Kinds == nil {
		cfg.Kinds = AllKinds()
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	s := &Source{cfg: cfg, log: log, kick: make(chan struct{}, 1), changed: make(chan struct{}), synced: make(chan struct{})}

	var kinds []cluster.Kind // the watched ones, in the order of cluster.Kinds
	needs := map[api]bool{}
	for _, k := range cluster.Kinds() {
		if slices.Contains(cfg.Kinds, Kind(k.Name)) {
			kinds = append(kinds, k)
			needs[apiOf(k)] = true
		}
	}
	if needs[apiIstio] && cfg.Clients.Istio == nil {
		return nil, errors.New("kube: Config.Clients.Istio is required to watch Istio kinds")
	}
	if cfg.WatchIgnored && cfg.Clients.Metadata == nil {
		return nil, errors.New("kube: Config.Clients.Metadata is required to watch ignored kinds")
	}
	if needs[apiGateway] && cfg.Clients.Gateway == nil {
		return nil, errors.New("kube: Config.Clients.Gateway is required to watch Gateway API kinds")
	}
	for _, k := range cfg.Kinds {
		if !slices.Contains(AllKinds(), k) {
			return nil, fmt.Errorf("kube: unknown kind %q", k)
		}
	}

	// Only informers that are asked for are created: a factory starts
	// exactly the informers requested from it.
	factories := map[api]*factory{}
	for _, k := range kinds {
		a := apiOf(k)
		if a == apiKube && Kind(k.Name) == Pods && cfg.NodeName != "" {
			a = apiKubeNodePods
		}
		if a == apiKube && Kind(k.Name) == Secrets {
			a = apiKubeSecrets
		}
		f := factories[a]
		if f == nil {
			f = newFactory(a, &cfg)
			factories[a] = f
			s.starters = append(s.starters, f.start)
			s.stoppers = append(s.stoppers, f.shutdown)
		}
		inf, err := f.informer(k.GroupVersionResource())
		if err != nil {
			return nil, fmt.Errorf("kube: %s informer: %w", k.Name, err)
		}
		s.watched = append(s.watched, watched{kind: Kind(k.Name), informer: inf})
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { s.bump() },
		UpdateFunc: func(o, n any) {
			if sameVersion(o, n) || sameNodeLabels(o, n) {
				return // a resync or a relist that found nothing new, or a Node heartbeat
			}
			s.bump()
		},
		DeleteFunc: func(any) { s.bump() },
	}
	for _, w := range s.watched {
		if _, err := w.informer.AddEventHandler(handler); err != nil {
			return nil, fmt.Errorf("kube: %s informer: %w", w.kind, err)
		}
	}
	return s, nil
}

// stripManagedFields drops metadata.managedFields before objects enter the
// caches: nothing here reads them and they are often the bulk of an object.
// A Node keeps only its name, identity and labels (its status, images and
// conditions are most of it, and only its topology labels are read).
func stripManagedFields(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		return &corev1.Node{
			TypeMeta: n.TypeMeta,
			ObjectMeta: metav1.ObjectMeta{
				Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels,
			},
		}, nil
	}
	if sec, ok := obj.(*corev1.Secret); ok {
		// Only what TLS origination reads; every other key (and the
		// annotations, which may hold a last-applied copy) is dropped
		// before the cache holds it.
		out := &corev1.Secret{TypeMeta: sec.TypeMeta, Type: sec.Type, ObjectMeta: metav1.ObjectMeta{
			Name: sec.Name, Namespace: sec.Namespace, UID: sec.UID, ResourceVersion: sec.ResourceVersion,
			CreationTimestamp: sec.CreationTimestamp,
		}}
		for _, k := range cluster.CredentialKeys {
			if v, ok := sec.Data[k]; ok {
				if out.Data == nil {
					out.Data = map[string][]byte{}
				}
				out.Data[k] = v
			}
		}
		return out, nil
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// sameNodeLabels: both are Nodes with the same labels, the only part of a
// Node read; its frequent status updates then publish nothing.
func sameNodeLabels(o, n any) bool {
	on, ok1 := o.(*corev1.Node)
	nn, ok2 := n.(*corev1.Node)
	return ok1 && ok2 && maps.Equal(on.Labels, nn.Labels)
}

// api is the clientset, and so the informer factory, a kind is read through.
type api int

const (
	apiKube         api = iota // Kubernetes' own kinds
	apiKubeNodePods            // Pods restricted to Config.NodeName
	apiKubeSecrets             // Secrets, without the types that hold no credential
	apiIstio                   // *.istio.io
	apiGateway                 // gateway.networking.k8s.io
)

func apiOf(k cluster.Kind) api {
	switch g := k.GroupVersion.Group; {
	case strings.HasSuffix(g, ".istio.io"):
		return apiIstio
	case g == gatewayv1.GroupName:
		return apiGateway
	default:
		return apiKube
	}
}

// factory is one shared informer factory, whichever clientset it is from.
type factory struct {
	start    func(stop <-chan struct{})
	shutdown func()
	informer func(schema.GroupVersionResource) (cache.SharedIndexInformer, error)
}

// genericInformer is what each generated GenericInformer type offers.
type genericInformer interface {
	Informer() cache.SharedIndexInformer
}

// informerFactory is what the three generated factory types have in common;
// G is each one's GenericInformer.
type informerFactory[G genericInformer] interface {
	Start(stop <-chan struct{})
	Shutdown()
	ForResource(schema.GroupVersionResource) (G, error)
}

func wrap[G genericInformer](f informerFactory[G]) *factory {
	return &factory{start: f.Start, shutdown: f.Shutdown, informer: func(r schema.GroupVersionResource) (cache.SharedIndexInformer, error) {
		g, err := f.ForResource(r)
		if err != nil {
			return nil, err
		}
		return g.Informer(), nil
	}}
}

// newFactory builds the factory for a; every one strips managed fields.
func newFactory(a api, cfg *Config) *factory {
	switch a {
	case apiIstio:
		return wrap[istioinformers.GenericInformer](istioinformers.NewSharedInformerFactoryWithOptions(cfg.Clients.Istio, 0,
			istioinformers.WithTransform(stripManagedFields)))
	case apiGateway:
		return wrap[gatewayinformers.GenericInformer](gatewayinformers.NewSharedInformerFactoryWithOptions(cfg.Clients.Gateway, 0,
			gatewayinformers.WithTransform(stripManagedFields)))
	}
	opts := []informers.SharedInformerOption{informers.WithTransform(stripManagedFields)}
	switch a {
	case apiKubeNodePods:
		sel := "spec.nodeName=" + cfg.NodeName
		opts = append(opts, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel }))
	case apiKubeSecrets:
		// Not the kinds that never hold a credential (service account
		// tokens, Helm releases: often most Secrets of a cluster).
		opts = append(opts, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = secretSelector }))
	}
	return wrap[informers.GenericInformer](informers.NewSharedInformerFactoryWithOptions(cfg.Clients.Kube, 0, opts...))
}

func sameVersion(o, n any) bool {
	om, err1 := meta.Accessor(o)
	nm, err2 := meta.Accessor(n)
	return err1 == nil && err2 == nil && om.GetResourceVersion() == nm.GetResourceVersion()
}

func (s *Source) bump() {
	s.events.Add(1)
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Current implements cluster.Source.
func (s *Source) Current() (*cluster.Objects, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.changed
}

// Synced is closed once every informer has synced and the first Objects
// are published.
func (s *Source) Synced() <-chan struct{} { return s.synced }

// Run implements cluster.Source: it starts the informers, publishes once
// they have all synced, then after every (debounced) change, until ctx is
// done. It may be called once.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("kube: Source.Run called twice")
	}
	for _, start := range s.starters {
		start(ctx.Done())
	}
	var ignoredDone sync.WaitGroup
	if s.cfg.WatchIgnored {
		ignoredDone.Go(func() { s.watchIgnored(ctx) })
	}
	defer func() {
		for _, stop := range s.stoppers {
			stop() // waits for the informer goroutines; ctx is done by now
		}
		ignoredDone.Wait()
	}()
	if !s.waitSynced(ctx) {
		return nil
	}
	s.publish()
	close(s.synced)
	s.log.Info("kubernetes informers synced", zap.Int("kinds", len(s.watched)), zap.String("node", s.cfg.NodeName))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		}
		t := time.NewTimer(s.cfg.Debounce)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		s.publish()
	}
}

// waitSynced polls the informers until all have synced, logging the ones
// still missing now and then (a CRD that is not installed never syncs).
func (s *Source) waitSynced(ctx context.Context) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	lastLog := start
	for {
		var missing []string
		for _, w := range s.watched {
			if !w.informer.HasSynced() {
				missing = append(missing, string(w.kind))
			}
		}
		if len(missing) == 0 {
			return true
		}
		if time.Since(lastLog) >= syncLogInterval {
			lastLog = time.Now()
			s.log.Warn("still waiting for kubernetes informers to sync (is the API server reachable, are the CRDs installed, may this account list them?)",
				zap.Strings("kinds", missing), zap.Duration("waited", time.Since(start)))
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// publish builds a new Objects from the caches if anything changed since
// the last one.
func (s *Source) publish() {
	n := s.events.Load()
	s.mu.Lock()
	if s.cur != nil && n == s.published {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	objs := &cluster.Objects{}
	for _, w := range s.watched {
		for _, o := range w.informer.GetStore().List() {
			objs.Add(o)
		}
	}
	s.addIgnored(objs)
	objs.Sort()
	s.mu.Lock()
	s.cur, s.published = objs, n
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}
