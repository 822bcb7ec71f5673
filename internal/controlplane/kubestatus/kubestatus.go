// Package kubestatus writes ServiceEntry auto-allocated addresses back to
// the Kubernetes API as istiod does (docs/protocol.md#dns): each
// eligible ServiceEntry's status.addresses lists its hosts' addresses, set
// with a JSON patch whose first operations test the previous value (and the
// object's UID), so two writers cannot both win. Only the replica holding a
// coordination.k8s.io Lease (client-go leader election) writes.
//
// Writer is an autoalloc.Store: the allocator already starts from each
// ServiceEntry's status.addresses, so Load returns nothing and Save hands
// the allocator's latest State to the leader's write loop (it never blocks
// on the API server). Writer is also the allocator's Gate: only the leader
// allocates; every other replica serves exactly what status.addresses
// says (never an address of its own), so all replicas serve the same
// addresses, and a new host gets its address on every replica once the
// leader has written it. Becoming (or ceasing to be) the leader signals
// the Gate, so the new leader allocates what status still lacks. A write
// that loses a test does not retry blindly: the allocator re-allocates
// from the winner's status on the next change.
//
// It does not allocate (internal/controlplane/autoalloc) and does not read
// the cluster itself: it follows a cluster.Source.
package kubestatus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// Defaults.
const (
	DefaultLeaseNamespace = "istio-system"
	DefaultLeaseName      = "ztunnel-cp" // the chart's Role grants exactly this Lease
	DefaultLeaseDuration  = 15 * time.Second
	DefaultRenewDeadline  = 10 * time.Second
	DefaultRetryPeriod    = 2 * time.Second
	// FieldManager names the writer in managedFields.
	FieldManager = "ztunnel-go-ip-autoallocate"
	// maxBackoff caps the retry interval after failed writes.
	maxBackoff = 30 * time.Second
)

// Config configures New.
type Config struct {
	// Istio patches ServiceEntry status. Required.
	Istio istioclient.Interface
	// Kube holds the Lease. Required.
	Kube kubernetes.Interface
	// Source supplies the ServiceEntries as last seen (their status is the
	// "previous value" of each write). Required; normally the same source
	// the control plane translates.
	Source cluster.Source
	// LeaseNamespace and LeaseName locate the Lease; "" means the defaults.
	LeaseNamespace, LeaseName string
	// Identity of this replica in the Lease; "" means <hostname>-<pid>.
	Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod tune leader election; 0
	// means the defaults (15 s, 10 s, 2 s, as most controllers).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Retries lists the write loop on the daemon's readiness page; nil: a
	// Retry of its own that logs to Log.
	Retries *backoff.Set
	// Log: nil means no logging.
	Log *zap.Logger
}

// Writer is the status writer and autoalloc.Store. Create it with New, then Run.
type Writer struct {
	cfg     Config
	log     *zap.Logger
	leading atomic.Bool

	kick chan struct{}
	gate chan struct{} // cap 1: leadership changed

	mu      sync.Mutex
	desired map[string][]Address // "ns/name" → addresses; nil until the first Save
	// savedRV is each ServiceEntry's resourceVersion in the source when
	// desired was saved: what the allocator (about) saw.
	savedRV map[string]string
	saves   uint64
}

// Address is one entry of ServiceEntry status.addresses.
type Address struct {
	Value string `json:"value"`
	Host  string `json:"host"`
}

// New validates cfg; nothing is contacted before Run.
func New(cfg Config) (*Writer, error) {
	if cfg.Istio == nil || cfg.Kube == nil || cfg.Source == nil {
		return nil, errors.New("kubestatus: Istio, Kube and Source are required")
	}
	if cfg.LeaseNamespace == "" {
		cfg.LeaseNamespace = DefaultLeaseNamespace
	}
	if cfg.LeaseName == "" {
		cfg.LeaseName = DefaultLeaseName
	}
	if cfg.Identity == "" {
		h, _ := os.Hostname()
		cfg.Identity = h + "-" + strconv.Itoa(os.Getpid())
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = DefaultRenewDeadline
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Writer{cfg: cfg, log: log, kick: make(chan struct{}, 1), gate: make(chan struct{}, 1)}, nil
}

// Load implements autoalloc.Store. The status of each ServiceEntry is the
// persisted state and the allocator reads it there, so Load returns the
// zero State (the allocation cursor restarts at the range start; taken
// addresses are skipped).
func (w *Writer) Load() (autoalloc.State, error) { return autoalloc.State{}, nil }

// Save implements autoalloc.Store: it records st as the addresses every
// ServiceEntry's status should list and wakes the write loop. It never
// fails and never blocks on the API server.
func (w *Writer) Save(st autoalloc.State) error {
	d := Desired(st)
	rv := map[string]string{}
	if objs, _ := w.cfg.Source.Current(); objs != nil {
		for _, se := range objs.ServiceEntries {
			rv[se.Namespace+"/"+se.Name] = se.ResourceVersion
		}
	}
	w.mu.Lock()
	w.desired, w.savedRV = d, rv
	w.saves++
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// Desired groups a State's allocations by ServiceEntry "ns/name", each
// host's IPv4 then IPv6 address, hosts in order.
func Desired(st autoalloc.State) map[string][]Address {
	out := map[string][]Address{}
	for _, al := range st.Allocations {
		k := al.Namespace + "/" + al.Name
		if al.V4.IsValid() {
			out[k] = append(out[k], Address{Value: al.V4.String(), Host: al.Host})
		}
		if al.V6.IsValid() {
			out[k] = append(out[k], Address{Value: al.V6.String(), Host: al.Host})
		}
	}
	for k := range out {
		sortAddrs(out[k])
	}
	return out
}

func sortAddrs(a []Address) {
	sort.SliceStable(a, func(i, j int) bool {
		if a[i].Host != a[j].Host {
			return a[i].Host < a[j].Host
		}
		// IPv4 before IPv6, as the allocator lists them.
		ai, aerr := netip.ParseAddr(a[i].Value)
		aj, berr := netip.ParseAddr(a[j].Value)
		if aerr == nil && berr == nil && ai.Is4() != aj.Is4() {
			return ai.Is4()
		}
		return a[i].Value < a[j].Value
	})
}

// Leading reports whether this replica holds the Lease.
func (w *Writer) Leading() bool { return w.leading.Load() }

// MayAllocate implements autoalloc.Gate: only the leader allocates.
func (w *Writer) MayAllocate() bool { return w.leading.Load() }

// GateChanged implements autoalloc.Gate: signalled when this replica
// starts or stops leading.
func (w *Writer) GateChanged() <-chan struct{} { return w.gate }

func (w *Writer) signalGate() {
	select {
	case w.gate <- struct{}{}:
	default:
	}
}

// Run takes part in leader election until ctx is done; while leading it
// keeps every ServiceEntry's status.addresses equal to the latest Save.
// Losing the Lease stops writing and re-enters the election. It returns nil
// when ctx is done.
func (w *Writer) Run(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: w.cfg.LeaseNamespace, Name: w.cfg.LeaseName},
		Client:     w.cfg.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: w.cfg.Identity},
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   w.cfg.LeaseDuration,
		RenewDeadline:   w.cfg.RenewDeadline,
		RetryPeriod:     w.cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            w.cfg.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				w.leading.Store(true)
				w.signalGate()
				w.log.Info("leading: writing ServiceEntry status.addresses", zap.String("identity", w.cfg.Identity))
				w.lead(lctx)
			},
			OnStoppedLeading: func() {
				if w.leading.Swap(false) {
					w.signalGate()
					w.log.Info("stopped leading ServiceEntry address writes", zap.String("identity", w.cfg.Identity))
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("kubestatus: leader election: %w", err)
	}
	for ctx.Err() == nil {
		le.Run(ctx) // returns when leadership is lost or ctx is done
		if ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(w.cfg.RetryPeriod):
			}
		}
	}
	return nil
}

// settleTime is how long a ServiceEntry change may go without a new Save
// before the allocator is taken to have seen it and left its addresses
// alone (it re-allocates within the control plane's debounce).
const settleTime = time.Second

// lead is the write loop while holding the Lease.
func (w *Writer) lead(ctx context.Context) {
	// Failed writes back off from 500 ms to maxBackoff, logged once per
	// step.
	policy := backoff.Policy{Initial: 500 * time.Millisecond, Max: maxBackoff}
	retry := backoff.New("ServiceEntry address writes", policy, w.log)
	if w.cfg.Retries != nil {
		retry = w.cfg.Retries.New("ServiceEntry address writes", policy)
	}
	settled := false
	for {
		objs, changed := w.cfg.Source.Current()
		var again <-chan time.Time
		if objs != nil {
			w.mu.Lock()
			saves := w.saves
			w.mu.Unlock()
			failed, deferred := w.reconcile(ctx, objs, settled)
			switch {
			case failed > 0:
				again = time.After(retry.Failed(fmt.Errorf("%d ServiceEntry status writes failed", failed)))
			case deferred > 0:
				retry.Succeeded()
				again = time.After(settleTime)
			default:
				retry.Succeeded()
			}
			settled = false
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-w.kick:
			case <-again:
				w.mu.Lock()
				settled = deferred > 0 && w.saves == saves
				w.mu.Unlock()
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-w.kick:
		}
	}
}

// Reconcile writes every ServiceEntry of objs whose status differs from the
// latest Save and returns how many writes failed (to be retried). Before
// the first Save it does nothing: an empty desired set must not wipe the
// addresses. A ServiceEntry whose non-empty status differs and that
// changed since the Save is left for the allocator to look at first (a
// later Reconcile writes it). Run calls it while leading; tests may call
// it directly.
func (w *Writer) Reconcile(ctx context.Context, objs *cluster.Objects) (failed int) {
	failed, _ = w.reconcile(ctx, objs, false)
	return failed
}

// reconcile is Reconcile; settled writes ServiceEntries that changed since
// the Save too, and deferred counts those it left.
func (w *Writer) reconcile(ctx context.Context, objs *cluster.Objects, settled bool) (failed, deferred int) {
	w.mu.Lock()
	desired, savedRV := w.desired, w.savedRV
	w.mu.Unlock()
	if desired == nil {
		return 0, 0
	}
	for _, se := range objs.ServiceEntries {
		key := se.Namespace + "/" + se.Name
		want := desired[key]
		have := statusAddrs(se)
		if sameSet(have, want) {
			continue
		}
		if len(have) > 0 && !settled && savedRV[key] != se.ResourceVersion {
			// Someone (an earlier leader, a user) set these addresses after
			// the allocator's last look: let it re-allocate from them.
			deferred++
			continue
		}
		if err := w.write(ctx, se.Namespace, se.Name, string(se.UID), have, want); err != nil {
			failed++
			w.log.Warn("writing ServiceEntry status.addresses failed; will retry", zap.String("service_entry", key), zap.Error(err))
		}
	}
	return failed, deferred
}

// ErrConflict is returned (wrapped) when the status changed since it was
// read: another writer won.
var ErrConflict = errors.New("status.addresses changed by another writer")

// write sets ns/name's status.addresses from have to want. A lost test
// re-reads the object: if it already holds want, or it is the same object
// with no addresses at all, the write is retried once from the fresh
// value; otherwise the conflict is left to the allocator.
func (w *Writer) write(ctx context.Context, ns, name, uid string, have, want []Address) error {
	err := w.patch(ctx, ns, name, uid, have, want)
	if !errors.Is(err, ErrConflict) {
		return err
	}
	fresh, gerr := w.cfg.Istio.NetworkingV1().ServiceEntries(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(gerr):
		return nil // deleted meanwhile
	case gerr != nil:
		return fmt.Errorf("kubestatus: re-read %s/%s: %w", ns, name, gerr)
	case string(fresh.UID) != uid:
		return nil // a new object of that name; the next translation handles it
	}
	now := statusAddrs(fresh)
	if sameSet(now, want) {
		return nil
	}
	if len(now) > 0 {
		w.log.Info("ServiceEntry status.addresses changed by another writer; re-allocating from it",
			zap.String("service_entry", ns+"/"+name), zap.Any("status", now), zap.Any("wanted", want))
		return nil
	}
	return w.patch(ctx, ns, name, uid, now, want)
}

type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// PatchVariants returns the JSON patches that move status.addresses from
// have to want, each guarded by test operations on the object's UID and on
// the previous value; the first that applies is meant. With no previous
// addresses there are two: status exists without addresses, or status is
// absent altogether.
func PatchVariants(uid string, have, want []Address) [][]byte {
	guard := op{Op: "test", Path: "/metadata/uid", Value: uid}
	var variants [][]op
	switch {
	case len(have) > 0 && len(want) > 0:
		variants = [][]op{{guard, {Op: "test", Path: "/status/addresses", Value: have}, {Op: "replace", Path: "/status/addresses", Value: want}}}
	case len(have) > 0:
		variants = [][]op{{guard, {Op: "test", Path: "/status/addresses", Value: have}, {Op: "remove", Path: "/status/addresses"}}}
	case len(want) > 0:
		variants = [][]op{
			{guard, {Op: "test", Path: "/status/addresses", Value: nil}, {Op: "add", Path: "/status/addresses", Value: want}},
			{guard, {Op: "test", Path: "/status", Value: nil}, {Op: "add", Path: "/status", Value: map[string]any{"addresses": want}}},
		}
	}
	out := make([][]byte, 0, len(variants))
	for _, v := range variants {
		b, _ := json.Marshal(v) // plain strings and slices: cannot fail
		out = append(out, b)
	}
	return out
}

// patch applies the first variant that passes its tests.
func (w *Writer) patch(ctx context.Context, ns, name, uid string, have, want []Address) error {
	variants := PatchVariants(uid, have, want)
	if len(variants) == 0 {
		return nil
	}
	var last error
	for _, body := range variants {
		// "remove" of an op marshals a null value; the server ignores it.
		_, err := w.cfg.Istio.NetworkingV1().ServiceEntries(ns).Patch(ctx, name, types.JSONPatchType, body,
			metav1.PatchOptions{FieldManager: FieldManager}, "status")
		switch {
		case err == nil:
			w.log.Info("ServiceEntry status.addresses written", zap.String("service_entry", ns+"/"+name), zap.Any("addresses", want))
			return nil
		case apierrors.IsNotFound(err):
			return nil // deleted; nothing to write
		case apierrors.IsInvalid(err) || apierrors.IsConflict(err):
			last = fmt.Errorf("kubestatus: %s/%s: %w: %v", ns, name, ErrConflict, err)
		default:
			return fmt.Errorf("kubestatus: patch %s/%s status: %w", ns, name, err)
		}
	}
	return last
}

func statusAddrs(se *networkingv1.ServiceEntry) []Address {
	var out []Address
	for _, a := range se.Status.GetAddresses() {
		out = append(out, Address{Value: a.GetValue(), Host: a.GetHost()})
	}
	return out
}

// sameSet compares address lists ignoring order.
func sameSet(a, b []Address) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	sortAddrs(x)
	sortAddrs(y)
	return slices.Equal(x, y)
}
