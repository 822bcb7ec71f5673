// Package kubeauth authenticates node proxies and workloads to the control
// plane with Kubernetes ServiceAccount tokens, as istiod does
// (docs/protocol.md#identity): the caller sends "authorization: Bearer
// <projected token>" (audience istio-ca); a TokenReview against the API
// server validates it. A token of a trusted node account (default
// istio-system/ztunnel, Istio's CA_TRUSTED_NODE_ACCOUNTS) that is bound to
// a pod makes the caller a node proxy of that pod's node; any other
// ServiceAccount token is a plain caller that may obtain only its own
// identity. Authenticator guards both the CA and the xDS stream through
// caserver's interceptors.
//
// Placement answers caserver's "does ns/sa run on node N?" from the API
// server (a pod LIST with a spec.nodeName field selector), optionally
// consulting a faster cached answer first.
//
// It does not sign anything and does not decide which identity a caller
// may obtain: internal/controlplane/caserver does, with the Caller and
// Placement given here.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
)

// Defaults and the TokenReview user.extra keys Kubernetes sets for tokens
// bound to a pod.
const (
	DefaultAudience = "istio-ca"
	ExtraPodName    = "authentication.kubernetes.io/pod-name"
	ExtraPodUID     = "authentication.kubernetes.io/pod-uid"
	ExtraNodeName   = "authentication.kubernetes.io/node-name"
	// DefaultCacheTTL is how long a successful review is reused (a node
	// proxy opens one xDS stream and several certificate requests at once).
	DefaultCacheTTL = 10 * time.Second
	// cacheMax bounds the review cache; when full it is emptied.
	cacheMax = 4096
	// lookupTimeout bounds the API calls of Placement.OnNode.
	lookupTimeout = 5 * time.Second
	saPrefix      = "system:serviceaccount:"
)

// DefaultTrustedNodeAccounts is Istio's Helm default.
func DefaultTrustedNodeAccounts() []string { return []string{"istio-system/ztunnel"} }

// ParseAccounts parses a comma-separated "namespace/name" list (Istio's
// CA_TRUSTED_NODE_ACCOUNTS format); blanks are ignored.
func ParseAccounts(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ns, name, ok := strings.Cut(f, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("kubeauth: trusted node account %q is not namespace/name", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// Config configures New.
type Config struct {
	// Client creates TokenReviews and reads pods. Required.
	Client kubernetes.Interface
	// Audiences the token must carry; nil means [DefaultAudience].
	Audiences []string
	// TrustedNodeAccounts are the "namespace/name" ServiceAccounts of node
	// proxies; nil means DefaultTrustedNodeAccounts, empty means none.
	TrustedNodeAccounts []string
	// CacheTTL: 0 means DefaultCacheTTL, negative disables the cache.
	CacheTTL time.Duration
	// Log: nil means no logging.
	Log *zap.Logger
}

// Authenticator is a caserver.Authenticator backed by TokenReview.
type Authenticator struct {
	cfg Config
	log *zap.Logger
	now func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]cached
}

type cached struct {
	caller  caserver.Caller
	expires time.Time
}

// New validates cfg.
func New(cfg Config) (*Authenticator, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubeauth: Config.Client is required")
	}
	if cfg.Audiences == nil {
		cfg.Audiences = []string{DefaultAudience}
	}
	if cfg.TrustedNodeAccounts == nil {
		cfg.TrustedNodeAccounts = DefaultTrustedNodeAccounts()
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Authenticator{cfg: cfg, log: log, now: time.Now, cache: map[[32]byte]cached{}}, nil
}

// bearer extracts the token of "authorization: Bearer <token>".
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", fmt.Errorf("%w: no authorization metadata (want \"Bearer <service account token>\")", caserver.ErrUnauthenticated)
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || tok == "" {
		return "", fmt.Errorf("%w: authorization metadata is not \"Bearer <token>\"", caserver.ErrUnauthenticated)
	}
	return tok, nil
}

// Authenticate implements caserver.Authenticator.
func (a *Authenticator) Authenticate(ctx context.Context) (caserver.Caller, error) {
	tok, err := bearer(ctx)
	if err != nil {
		return caserver.Caller{}, err
	}
	key := sha256.Sum256([]byte(tok))
	if c, ok := a.cached(key); ok {
		return c, nil
	}
	tr, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: tok, Audiences: a.cfg.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return caserver.Caller{}, fmt.Errorf("%w: token review failed (is the API server reachable?): %v", caserver.ErrUnauthenticated, err)
	}
	st := tr.Status
	if !st.Authenticated {
		why := st.Error
		if why == "" {
			why = "token not authenticated"
		}
		return caserver.Caller{}, fmt.Errorf("%w: %s", caserver.ErrUnauthenticated, why)
	}
	if len(st.Audiences) > 0 && !overlaps(st.Audiences, a.cfg.Audiences) {
		return caserver.Caller{}, fmt.Errorf("%w: token audiences %v, want one of %v", caserver.ErrUnauthenticated, st.Audiences, a.cfg.Audiences)
	}
	c, err := a.callerFor(ctx, st.User)
	if err != nil {
		return caserver.Caller{}, err
	}
	a.store(key, c)
	return c, nil
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// ServiceAccountOf returns "namespace/name" of a ServiceAccount username
// (system:serviceaccount:<ns>:<name>).
func ServiceAccountOf(username string) (string, bool) {
	rest, ok := strings.CutPrefix(username, saPrefix)
	if !ok {
		return "", false
	}
	ns, name, ok := strings.Cut(rest, ":")
	if !ok || ns == "" || name == "" || strings.Contains(name, ":") {
		return "", false
	}
	return ns + "/" + name, true
}

func extra(u authenticationv1.UserInfo, k string) string {
	if v := u.Extra[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// callerFor maps a reviewed user to a Caller. A trusted node account's
// node comes from the node-name extra, else from the bound pod (read from
// the API, its UID checked against the token's).
func (a *Authenticator) callerFor(ctx context.Context, u authenticationv1.UserInfo) (caserver.Caller, error) {
	sa, ok := ServiceAccountOf(u.Username)
	if !ok {
		return caserver.Caller{}, fmt.Errorf("%w: %q is not a service account", caserver.ErrUnauthenticated, u.Username)
	}
	c := caserver.Caller{ServiceAccount: sa}
	if !slices.Contains(a.cfg.TrustedNodeAccounts, sa) {
		return c, nil
	}
	if node := extra(u, ExtraNodeName); node != "" {
		c.Node = node
		return c, nil
	}
	podName := extra(u, ExtraPodName)
	if podName == "" {
		a.log.Warn("trusted node account token is not bound to a pod; treating it as a plain service account", zap.String("service_account", sa))
		return c, nil
	}
	ns, _, _ := strings.Cut(sa, "/")
	pod, err := a.cfg.Client.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return caserver.Caller{}, fmt.Errorf("%w: node proxy pod %s/%s: %v", caserver.ErrUnauthenticated, ns, podName, err)
	}
	if uid := extra(u, ExtraPodUID); uid != "" && string(pod.UID) != uid {
		return caserver.Caller{}, fmt.Errorf("%w: node proxy pod %s/%s has UID %s, the token is bound to %s", caserver.ErrUnauthenticated, ns, podName, pod.UID, uid)
	}
	if pod.Spec.NodeName == "" {
		return caserver.Caller{}, fmt.Errorf("%w: node proxy pod %s/%s is not scheduled on a node", caserver.ErrUnauthenticated, ns, podName)
	}
	c.Node = pod.Spec.NodeName
	return c, nil
}

func (a *Authenticator) cached(key [32]byte) (caserver.Caller, bool) {
	if a.cfg.CacheTTL < 0 {
		return caserver.Caller{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.cache[key]
	if !ok || !a.now().Before(e.expires) {
		delete(a.cache, key)
		return caserver.Caller{}, false
	}
	return e.caller, true
}

func (a *Authenticator) store(key [32]byte, c caserver.Caller) {
	if a.cfg.CacheTTL < 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= cacheMax {
		clear(a.cache)
	}
	a.cache[key] = cached{caller: c, expires: a.now().Add(a.cfg.CacheTTL)}
}

// Placement is a caserver.Placement that asks the API server.
type Placement struct {
	// Client lists pods. Required.
	Client kubernetes.Interface
	// Cached, if set, is asked first (the control plane's informer view);
	// only its "no" is checked against the API server, so a pod scheduled
	// a moment ago is found before the informers deliver it.
	Cached caserver.Placement
	// Log: nil means no logging.
	Log *zap.Logger
}

// OnNode implements caserver.Placement: some pod of namespace ns with
// service account sa, not finished, has spec.nodeName == node.
func (p *Placement) OnNode(node, ns, sa string) bool {
	if p.Cached != nil && p.Cached.OnNode(node, ns, sa) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	pods, err := p.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		if p.Log != nil {
			p.Log.Warn("placement check against the API server failed; refusing", zap.String("node", node),
				zap.String("service_account", ns+"/"+sa), zap.Error(err))
		}
		return false
	}
	return RunsOn(pods.Items, node, sa)
}

// RunsOn reports whether a live pod in pods, on node, runs as service
// account sa ("" counts as "default").
func RunsOn(pods []corev1.Pod, node, sa string) bool {
	for i := range pods {
		p := &pods[i]
		psa := p.Spec.ServiceAccountName
		if psa == "" {
			psa = "default"
		}
		if p.Spec.NodeName == node && psa == sa && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return true
		}
	}
	return false
}
