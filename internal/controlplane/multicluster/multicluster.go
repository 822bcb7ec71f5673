// Package multicluster reads the other clusters of a multi-primary mesh,
// as istiod's secret controller does: it watches Istio's remote secrets
// (Secrets in the system namespace labelled istio/multiCluster=true, each
// data key a cluster id and its value a kubeconfig, as `istioctl
// create-remote-secret` writes them) in this cluster, and for each remote
// cluster runs a read-only cluster/kube Source of the kinds the workload
// merge needs: Namespaces, Pods, Services, EndpointSlices, Nodes (for
// locality) and Gateways (east-west gateways; only when the remote serves
// Gateway API). Remote policies are not read: each primary enforces its
// own cluster's.
//
// Current publishes the remote clusters' latest objects for
// translate.Merger. Secrets added, removed or rotated start and stop
// sources; a rotated kubeconfig's new source replaces the old one once it
// has synced. A cluster whose API server cannot be reached or refuses the
// credentials (a probe every ProbeInterval) keeps its last good objects for
// StaleAfter and is then left out until a probe succeeds again; a deleted
// secret drops its clusters at once. Ready holds readiness until the
// remotes are read, for SyncTimeout at most. Nothing here waits on a remote:
// every source runs on its own, and Current only reads what they last
// published, so one slow or dead remote never holds back the others or
// this cluster.
//
// It does not translate (translate.Merger) and writes nothing anywhere.
package multicluster

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// SecretLabel marks a remote secret (value "true"), as istiod's
// multicluster.MultiClusterSecretLabel.
const SecretLabel = "istio/multiCluster"

// Defaults of Config.
const (
	// DefaultStaleAfter is how long a remote cluster that cannot be read
	// keeps its last objects: long enough to ride out an API server
	// restart or a credential rotation, short enough that endpoints of a
	// cluster that is gone do not linger.
	DefaultStaleAfter    = 5 * time.Minute
	DefaultProbeInterval = 10 * time.Second
	// DefaultSyncTimeout bounds how long Ready waits for the remote
	// clusters' first read (istiod's PILOT_REMOTE_CLUSTER_TIMEOUT).
	DefaultSyncTimeout = 30 * time.Second
	probeTimeout       = 5 * time.Second
)

// RemoteKinds are the kinds read from a remote cluster (Gateways only
// when it serves them).
var RemoteKinds = []kube.Kind{kube.Namespaces, kube.Pods, kube.Services, kube.EndpointSlices, kube.Nodes}

// Config configures New.
type Config struct {
	// Kube reads the remote secrets of this cluster. Required.
	Kube kubernetes.Interface
	// Namespace holds the remote secrets (the system namespace). Required.
	Namespace string
	// ClusterID is this cluster's id: a secret entry naming it is ignored.
	ClusterID string
	// StaleAfter: 0 means DefaultStaleAfter.
	StaleAfter time.Duration
	// ProbeInterval: 0 means DefaultProbeInterval.
	ProbeInterval time.Duration
	// SyncTimeout: 0 means DefaultSyncTimeout.
	SyncTimeout time.Duration
	// Debounce of the remote sources (0: kube.DefaultDebounce).
	Debounce time.Duration
	// Log: nil means no logging.
	Log *zap.Logger
}

// Status is one remote cluster's state, for the config dump.
type Status struct {
	ID     string `json:"id"`
	Secret string `json:"secret"` // namespace/name
	// State: "syncing" (no objects yet), "ok", "unreachable" (probes
	// fail; its last objects are still used), "stale" (left out), or
	// "refused" (the kubeconfig is refused; Error says why). A rotation's
	// new credentials, until they sync, are "rotation <state>".
	State     string    `json:"state"`
	Error     string    `json:"error,omitempty"`
	LastProbe time.Time `json:"lastGoodProbe,omitzero"`
}

// Controller is the remote-secret controller. Create it with New, then Run.
type Controller struct {
	cfg  Config
	log  *zap.Logger
	kick chan struct{}

	mu      sync.Mutex
	running map[string]*remote // by cluster id: the active one
	pending map[string]*remote // a rotation's new one, until it syncs
	refused map[string]refusal // cluster id → why its kubeconfig is refused
	cur     []translate.RemoteCluster
	changed chan struct{}
	states  map[string]string // cluster id → last logged state
	logged  map[string]bool   // logOnce keys
	// secretsSynced: the first reconcile ran; started: when Run began.
	secretsSynced bool
	started       time.Time
}

// refusal is a kubeconfig RESTConfig refused, kept so that it is not
// parsed (and logged) again until the secret changes.
type refusal struct {
	Status
	sha [32]byte
}

// New validates cfg; nothing is contacted before Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Kube == nil || cfg.Namespace == "" {
		return nil, errors.New("multicluster: Kube and Namespace are required")
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = DefaultSyncTimeout
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Controller{
		cfg: cfg, log: log, kick: make(chan struct{}, 1), running: map[string]*remote{}, pending: map[string]*remote{},
		refused: map[string]refusal{}, changed: make(chan struct{}), states: map[string]string{},
		logged: map[string]bool{},
	}, nil
}

// Current returns the remote clusters to merge (sorted by id; nil before
// any is read) and a channel closed when that changes.
func (c *Controller) Current() ([]translate.RemoteCluster, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, c.changed
}

// Statuses lists every remote cluster named by a secret, sorted by id: the
// one in use, then a rotation's new credentials while they sync, then a
// refused kubeconfig (a bad rotation keeps the working credentials).
func (c *Controller) Statuses() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Status
	now := time.Now()
	for id, r := range c.running {
		out = append(out, r.status(id, now, c.cfg.StaleAfter))
	}
	for id, r := range c.pending {
		st := r.status(id, now, c.cfg.StaleAfter)
		st.State = "rotation " + st.State // the new credentials, until they sync
		out = append(out, st)
	}
	for _, s := range c.refused {
		out = append(out, s.Status)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Ready reports whether the remote clusters had their chance to be read
// before this control plane serves: the secrets are read, and every
// cluster they name has published its objects, gone stale, or had its
// kubeconfig refused, or SyncTimeout has passed since Run began (as
// istiod's PILOT_REMOTE_CLUSTER_TIMEOUT), whether or not the secrets could
// be read. A readiness condition:
// a replica that restarts does not serve node proxies global services
// without their remote endpoints, and a dead remote delays it by
// SyncTimeout at most.
func (c *Controller) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started.IsZero() {
		return false
	}
	if time.Since(c.started) >= c.cfg.SyncTimeout {
		return true // even when the secrets cannot be read
	}
	if !c.secretsSynced {
		return false
	}
	now := time.Now()
	for id, r := range c.running {
		if st := r.status(id, now, c.cfg.StaleAfter); st.State == stateSyncing {
			return false
		}
	}
	return true
}

// Report is Statuses as config dump lines:
// "<id> (secret <ns/name>): <state>[: <error>]".
func (c *Controller) Report() []string {
	var out []string
	for _, s := range c.Statuses() {
		l := fmt.Sprintf("%s (secret %s): %s", s.ID, s.Secret, s.State)
		if s.Error != "" {
			l += ": " + s.Error
		}
		out = append(out, l)
	}
	return out
}

func (c *Controller) bump() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run watches the remote secrets and runs the remote sources until ctx is
// done.
func (c *Controller) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(c.cfg.Kube, 0, informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = SecretLabel + "=true" }))
	inf := f.Core().V1().Secrets().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.bump() },
		UpdateFunc: func(any, any) { c.bump() },
		DeleteFunc: func(any) { c.bump() },
	}); err != nil {
		return fmt.Errorf("multicluster: secret informer: %w", err)
	}
	c.mu.Lock()
	c.started = time.Now()
	c.mu.Unlock()
	f.Start(ctx.Done())
	defer f.Shutdown()
	var wg sync.WaitGroup
	defer func() {
		c.mu.Lock()
		for _, r := range c.running {
			r.stop()
		}
		for _, r := range c.pending {
			r.stop()
		}
		c.mu.Unlock()
		wg.Wait()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	c.log.Info("remote secrets synced", zap.String("namespace", c.cfg.Namespace), zap.String("label", SecretLabel+"=true"))
	// A regular tick re-evaluates staleness even when no source changes.
	tick := time.NewTicker(c.cfg.ProbeInterval)
	defer tick.Stop()
	for {
		c.reconcile(ctx, inf.GetStore(), &wg)
		c.publish()
		c.mu.Lock()
		c.secretsSynced = true
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-tick.C:
		}
	}
}

// desired is one cluster a secret names.
type desired struct {
	secret     string
	kubeconfig []byte
	sha        [32]byte
}

// reconcile starts, rotates and stops remote sources to match the secrets.
func (c *Controller) reconcile(ctx context.Context, store cache.Store, wg *sync.WaitGroup) {
	want := map[string]desired{}
	var secrets []*corev1.Secret
	for _, o := range store.List() {
		if s, ok := o.(*corev1.Secret); ok {
			secrets = append(secrets, s)
		}
	}
	// Deterministic when two secrets name one cluster: the first by name
	// wins (istiod keeps whichever registered first).
	sort.Slice(secrets, func(i, j int) bool { return secrets[i].Name < secrets[j].Name })
	for _, s := range secrets {
		key := s.Namespace + "/" + s.Name
		for _, id := range slices.Sorted(maps.Keys(s.Data)) {
			switch prev, dup := want[id]; {
			case id == c.cfg.ClusterID:
				c.logOnce(id, "self", "remote secret names this cluster; ignored", zap.String("secret", key))
				continue
			case dup:
				c.logOnce(id, "dup:"+key, "cluster already named by another remote secret; ignored",
					zap.String("secret", key), zap.String("used", prev.secret))
				continue
			}
			want[id] = desired{secret: key, kubeconfig: s.Data[id], sha: sha256.Sum256(s.Data[id])}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, r := range c.running {
		if _, ok := want[id]; !ok {
			c.log.Info("remote cluster removed", zap.String("cluster", id), zap.String("secret", r.secret))
			r.stop()
			delete(c.running, id)
			delete(c.states, id)
		}
	}
	for id, r := range c.pending {
		if d, ok := want[id]; !ok || d.sha != r.sha {
			r.stop()
			delete(c.pending, id)
		}
	}
	for id := range c.refused {
		if _, ok := want[id]; !ok {
			delete(c.refused, id)
		}
	}
	for id, d := range want {
		cur := c.running[id]
		if cur != nil && cur.sha == d.sha || c.pending[id] != nil {
			continue
		}
		if st, ok := c.refused[id]; ok && st.sha == d.sha {
			continue
		}
		r, err := newRemote(id, d)
		if err != nil {
			// A bad rotation keeps the credentials that work (cur), which
			// go stale on their own if they stop working.
			c.refused[id] = refusal{Status{ID: id, Secret: d.secret, State: "refused", Error: err.Error()}, d.sha}
			c.log.Error("remote cluster kubeconfig refused; its workloads are not merged", zap.String("cluster", id),
				zap.String("secret", d.secret), zap.Error(err))
			continue
		}
		delete(c.refused, id)
		wg.Go(func() { r.run(ctx, c) })
		if cur == nil {
			c.log.Info("remote cluster added", zap.String("cluster", id), zap.String("secret", d.secret))
			c.running[id] = r
		} else {
			c.log.Info("remote cluster credentials rotated; switching once the new ones have synced",
				zap.String("cluster", id), zap.String("secret", d.secret))
			c.pending[id] = r
		}
	}
}

// publish promotes rotations whose new source has synced and publishes the
// clusters to merge: every running one with objects that is not stale.
func (c *Controller) publish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, p := range c.pending {
		if p.objects() == nil {
			continue
		}
		if old := c.running[id]; old != nil {
			old.stop()
		}
		c.running[id] = p
		delete(c.pending, id)
		c.log.Info("remote cluster now read with its rotated credentials", zap.String("cluster", id), zap.String("secret", p.secret))
	}
	now := time.Now()
	var out []translate.RemoteCluster
	for _, id := range slices.Sorted(maps.Keys(c.running)) {
		r := c.running[id]
		st := r.status(id, now, c.cfg.StaleAfter)
		if c.states[id] != st.State {
			c.states[id] = st.State
			fields := []zap.Field{zap.String("cluster", id), zap.String("secret", r.secret), zap.String("state", st.State)}
			switch st.State {
			case stateUnreachable:
				c.log.Warn("remote cluster unreachable; keeping its last objects until it is stale",
					append(fields, zap.String("error", st.Error), zap.Duration("stale_after", c.cfg.StaleAfter))...)
			case stateStale:
				c.log.Error("remote cluster stale; its workloads are dropped until it can be read again",
					append(fields, zap.String("error", st.Error), zap.Time("last_good_probe", st.LastProbe))...)
			default:
				c.log.Info("remote cluster state", fields...)
			}
		}
		if objs := r.objects(); objs != nil && st.State != stateStale {
			out = append(out, translate.RemoteCluster{ID: id, Objs: objs})
		}
	}
	if !slices.Equal(out, c.cur) {
		c.cur = out
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

func (c *Controller) logOnce(id, key, msg string, fields ...zap.Field) {
	if c.logged[id+"\x00"+key] {
		return
	}
	c.logged[id+"\x00"+key] = true
	c.log.Warn(msg, append(fields, zap.String("cluster", id))...)
}

// The states of Status.State.
const (
	stateSyncing     = "syncing"
	stateOK          = "ok"
	stateUnreachable = "unreachable"
	stateStale       = "stale"
)

// remote is one remote cluster's source and its health probe.
type remote struct {
	id, secret string
	sha        [32]byte
	clients    *kube.Clients
	stopOnce   sync.Once
	stopCh     chan struct{}

	mu   sync.Mutex
	src  *kube.Source // nil until discovery has answered
	okAt time.Time    // last good probe (the start before the first)
	err  string       // last probe's or discovery's error; "" when it worked
}

func newRemote(id string, d desired) (*remote, error) {
	rc, err := RESTConfig(d.kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = rest.DefaultKubernetesUserAgent() + " ztunnel-cp multicluster"
	clients, err := kube.NewClients(rc)
	if err != nil {
		return nil, err
	}
	return &remote{id: id, secret: d.secret, sha: d.sha, clients: clients, stopCh: make(chan struct{}), okAt: time.Now()}, nil
}

func (r *remote) stop() { r.stopOnce.Do(func() { close(r.stopCh) }) }

func (r *remote) objects() *cluster.Objects {
	r.mu.Lock()
	src := r.src
	r.mu.Unlock()
	if src == nil {
		return nil
	}
	objs, _ := src.Current()
	return objs
}

func (r *remote) status(id string, now time.Time, staleAfter time.Duration) Status {
	objs := r.objects()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{ID: id, Secret: r.secret, Error: r.err, LastProbe: r.okAt}
	switch {
	case now.Sub(r.okAt) > staleAfter:
		st.State = stateStale
	case objs == nil:
		st.State = stateSyncing
	case r.err != "":
		st.State = stateUnreachable
	default:
		st.State = stateOK
	}
	return st
}

// setProbe records a probe's outcome and reports whether the state the
// controller shows may have changed.
func (r *remote) setProbe(err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	before := r.err
	if err == nil {
		r.okAt, r.err = time.Now(), ""
	} else {
		r.err = err.Error()
	}
	return before != r.err
}

// run finds out whether the remote serves Gateways, then runs its source
// and probes it until stopped.
func (r *remote) run(parent context.Context, c *Controller) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-r.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	wait := func() bool {
		t := time.NewTimer(c.cfg.ProbeInterval)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	log := c.log.With(zap.String("cluster", r.id))
	kinds := slices.Clone(RemoteKinds)
	for {
		gw, err := servesGateways(ctx, r.clients.Kube)
		if r.setProbe(err) {
			c.bump()
		}
		if err == nil {
			if gw {
				kinds = append(kinds, kube.Gateways)
			} else {
				log.Warn("remote cluster does not serve Gateway API Gateways; its east-west gateways are not read")
			}
			break
		}
		if !wait() {
			return
		}
	}
	src, err := kube.New(kube.Config{Clients: r.clients, Kinds: kinds, Debounce: c.cfg.Debounce, Log: log.Named("source")})
	if err != nil {
		log.Error("remote cluster source", zap.Error(err))
		return
	}
	r.mu.Lock()
	r.src = src
	r.mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if err := src.Run(ctx); err != nil {
			log.Error("remote cluster source stopped", zap.Error(err))
		}
	})
	wg.Go(func() {
		for {
			_, ch := src.Current()
			select {
			case <-ctx.Done():
				return
			case <-ch:
				c.bump()
			}
		}
	})
	for wait() {
		pctx, pcancel := context.WithTimeout(ctx, probeTimeout)
		_, err := r.clients.Kube.CoreV1().Namespaces().List(pctx, metav1.ListOptions{Limit: 1})
		pcancel()
		if ctx.Err() != nil {
			return
		}
		if r.setProbe(err) {
			c.bump()
		}
	}
}

// servesGateways asks the remote's discovery whether it serves
// gateway.networking.k8s.io/v1 gateways (a kind whose CRD is missing would
// keep the source from ever syncing).
func servesGateways(ctx context.Context, k kubernetes.Interface) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	body, err := k.Discovery().RESTClient().Get().AbsPath("/apis/" + gatewayv1.GroupVersion.String()).Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovery: %w", err)
	}
	var rl metav1.APIResourceList
	if err := json.Unmarshal(body, &rl); err != nil {
		return false, fmt.Errorf("discovery of %s: %w", gatewayv1.GroupVersion, err)
	}
	for _, r := range rl.APIResources {
		if r.Name == "gateways" {
			return true, nil
		}
	}
	return false, nil
}
