package kubestatus

import (
	"context"
	"errors"
	"reflect"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/flowcontrol"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// Route status defaults.
const (
	// DefaultRouteWritesPerSecond and DefaultRouteWriteBurst bound the
	// status writes to the API server (a tenant who churns routes must
	// not make the control plane flood it).
	DefaultRouteWritesPerSecond = 10
	DefaultRouteWriteBurst      = 20
	// routeResync re-checks every route even without a change: a replica
	// that has just become the leader, a write that lost a conflict.
	routeResync = 10 * time.Second
)

// RouteConfig configures NewRouteWriter.
type RouteConfig struct {
	// Gateway updates HTTPRoute and GRPCRoute status. Required.
	Gateway gatewayclient.Interface
	// Source supplies the routes as last seen. Required.
	Source cluster.Source
	// Translate is the translation's configuration (domain suffix).
	Translate translate.Config
	// Leading reports whether this replica may write (the lease of the
	// ServiceEntry Writer). nil: always.
	Leading func() bool
	// WritesPerSecond and Burst: 0 means the defaults.
	WritesPerSecond float32
	Burst           int
	Log             *zap.Logger
	// Now is the clock of lastTransitionTime; nil: time.Now.
	Now func() time.Time
}

// RouteWriter keeps the status.parents entries under
// translate.RouteControllerName of every HTTPRoute and GRPCRoute equal to
// translate.RouteStatuses: Accepted and ResolvedRefs, per mesh parentRef.
// Entries of other controllers (istiod's, a Gateway's) are kept as they
// are. status.parents is an atomic list, so each write is a read-modify-
// write of the whole list guarded by the object's resourceVersion; a lost
// conflict is retried from the next read. It writes only while Leading,
// only what changed (conditions compared without their timestamps), and at
// most WritesPerSecond.
type RouteWriter struct {
	cfg     RouteConfig
	log     *zap.Logger
	limiter flowcontrol.RateLimiter
}

// NewRouteWriter validates cfg.
func NewRouteWriter(cfg RouteConfig) (*RouteWriter, error) {
	if cfg.Gateway == nil || cfg.Source == nil {
		return nil, errors.New("kubestatus: RouteConfig.Gateway and Source are required")
	}
	if cfg.Leading == nil {
		cfg.Leading = func() bool { return true }
	}
	if cfg.WritesPerSecond <= 0 {
		cfg.WritesPerSecond = DefaultRouteWritesPerSecond
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultRouteWriteBurst
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &RouteWriter{cfg: cfg, log: log, limiter: flowcontrol.NewTokenBucketRateLimiter(cfg.WritesPerSecond, cfg.Burst)}, nil
}

// Run reconciles after every change of the source, and every few seconds,
// until ctx is done.
func (w *RouteWriter) Run(ctx context.Context) error {
	tick := time.NewTicker(routeResync)
	defer tick.Stop()
	for {
		objs, changed := w.cfg.Source.Current()
		if objs != nil && w.cfg.Leading() {
			w.Reconcile(ctx, objs)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// Reconcile writes the routes of objs whose entries differ and returns how
// many it wrote and how many writes failed. Tests call it directly.
func (w *RouteWriter) Reconcile(ctx context.Context, objs *cluster.Objects) (written, failed int) {
	want := map[string]translate.RouteStatus{}
	for _, st := range translate.RouteStatuses(w.cfg.Translate, objs) {
		want[st.Kind+"/"+st.Namespace+"/"+st.Name] = st
	}
	do := func(kind string, meta *metav1.ObjectMeta, have []gatewayv1.RouteParentStatus, write func([]gatewayv1.RouteParentStatus) error) {
		st := want[kind+"/"+meta.Namespace+"/"+meta.Name]
		parents, changed := w.merge(have, st)
		if !changed {
			return
		}
		if ctx.Err() != nil || w.limiter.Wait(ctx) != nil {
			return
		}
		switch err := write(parents); {
		case err == nil:
			written++
			w.log.Info("route status.parents written", zap.String("kind", kind), zap.String("route", meta.Namespace+"/"+meta.Name))
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			failed++ // changed meanwhile: the next read retries
		default:
			failed++
			w.log.Warn("writing route status.parents failed; will retry", zap.String("kind", kind),
				zap.String("route", meta.Namespace+"/"+meta.Name), zap.Error(err))
		}
	}
	for _, r := range objs.HTTPRoutes {
		do("HTTPRoute", &r.ObjectMeta, r.Status.Parents, func(p []gatewayv1.RouteParentStatus) error {
			c := r.DeepCopy()
			c.Status.Parents = p
			_, err := w.cfg.Gateway.GatewayV1().HTTPRoutes(r.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{FieldManager: RouteFieldManager})
			return err
		})
	}
	for _, r := range objs.GRPCRoutes {
		do("GRPCRoute", &r.ObjectMeta, r.Status.Parents, func(p []gatewayv1.RouteParentStatus) error {
			c := r.DeepCopy()
			c.Status.Parents = p
			_, err := w.cfg.Gateway.GatewayV1().GRPCRoutes(r.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{FieldManager: RouteFieldManager})
			return err
		})
	}
	return written, failed
}

// RouteFieldManager names the route status writer in managedFields.
const RouteFieldManager = "ztunnel-go-route-status"

// merge returns have with its entries of our controller replaced by st's,
// and whether that differs from have. A condition that keeps its status
// keeps its lastTransitionTime.
func (w *RouteWriter) merge(have []gatewayv1.RouteParentStatus, st translate.RouteStatus) ([]gatewayv1.RouteParentStatus, bool) {
	var others, ours []gatewayv1.RouteParentStatus
	for _, p := range have {
		if p.ControllerName == translate.RouteControllerName {
			ours = append(ours, p)
		} else {
			others = append(others, p)
		}
	}
	now := metav1.NewTime(w.cfg.Now().Truncate(time.Second))
	var want []gatewayv1.RouteParentStatus
	for _, p := range st.Parents {
		var old []metav1.Condition
		for _, o := range ours {
			if reflect.DeepEqual(o.ParentRef, p.ParentRef) {
				old = o.Conditions
			}
		}
		cond := func(t gatewayv1.RouteConditionType, c translate.RouteCondition) metav1.Condition {
			s := metav1.ConditionFalse
			if c.Status {
				s = metav1.ConditionTrue
			}
			mc := metav1.Condition{Type: string(t), Status: s, Reason: string(c.Reason), Message: truncate(c.Message), ObservedGeneration: st.Generation, LastTransitionTime: now}
			for _, o := range old {
				if o.Type == mc.Type && o.Status == mc.Status {
					mc.LastTransitionTime = o.LastTransitionTime
				}
			}
			return mc
		}
		want = append(want, gatewayv1.RouteParentStatus{
			ParentRef:      p.ParentRef,
			ControllerName: translate.RouteControllerName,
			Conditions: []metav1.Condition{
				cond(gatewayv1.RouteConditionAccepted, p.Accepted),
				cond(gatewayv1.RouteConditionResolvedRefs, p.ResolvedRefs),
			},
		})
	}
	if sameParents(ours, want) {
		return have, false
	}
	// The list holds at most 32 entries (CRD validation); ours go after
	// the others' and are cut first.
	out := append(others, want...)
	if len(out) > 32 {
		out = out[:32]
	}
	return out, true
}

// sameParents compares entries ignoring lastTransitionTime.
func sameParents(a, b []gatewayv1.RouteParentStatus) bool {
	if len(a) != len(b) {
		return false
	}
	strip := func(ps []gatewayv1.RouteParentStatus) []gatewayv1.RouteParentStatus {
		out := make([]gatewayv1.RouteParentStatus, len(ps))
		for i, p := range ps {
			p.Conditions = append([]metav1.Condition(nil), p.Conditions...)
			for j := range p.Conditions {
				p.Conditions[j].LastTransitionTime = metav1.Time{}
			}
			out[i] = p
		}
		return out
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// truncate keeps a message within the API's 32768 bytes.
func truncate(s string) string {
	const limit = 32768
	if len(s) <= limit {
		return s
	}
	return s[:limit-len("...")] + "..."
}
