package kubestatus

// Istio object status: what the control plane made of each
// AuthorizationPolicy, PeerAuthentication, RequestAuthentication,
// VirtualService, DestinationRule and Telemetry (translate.PolicyStatus), written where
// users look, as istiod writes it (istio.io/api meta/v1alpha1 IstioStatus):
//
//   - status.conditions holds one condition of type Reconciled (the type
//     istiod's status reporting used for "this generation was processed")
//     with status True when the object is enforced as written, else False,
//     a CamelCase reason (ConditionReason*) and a message that names every
//     field that cannot be enforced ("spec.rules[0].from[0].source.ipBlocks[0]:
//     ..."), as the config dump and zctl analyze do.
//   - status.validationMessages holds istio.io/api analysis/v1alpha1
//     AnalysisMessageBase entries: IST0106 SchemaValidationError (level
//     ERROR, Istio's code for a value its validation rejects) when a value
//     cannot be parsed or enforced, and ZTG0001 NotEnforced (level WARNING,
//     ztunnel-go's own code; Istio has none for it) when the object is not,
//     or only partly, enforced for another reason. AnalysisMessageBase has
//     no text: the condition's message says which field and why.
//
// Only the leader writes (the ServiceEntry address Lease), at most
// IstioStatusQPS objects a second, and only objects whose status differs
// from what we would write. The write is a JSON merge patch of the status
// subresource that carries metadata.resourceVersion (a stale read gets 409
// and is retried from the next read) and replaces only status.conditions
// and status.validationMessages: conditions of other types and messages
// with codes we do not write are copied through, and status.addresses
// (ServiceEntry, written by Writer) is not in the patch at all.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	analysisv1alpha1 "istio.io/api/analysis/v1alpha1"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// ConditionReconciled is the condition type the control plane owns in
// status.conditions.
const ConditionReconciled = "Reconciled"

// Reasons of the Reconciled condition. Accepted, Invalid and
// PartiallyInvalid are istiod's (pilot/pkg/model WaypointPolicyReason*).
const (
	// ConditionReasonAccepted: enforced as written (status True).
	ConditionReasonAccepted = "Accepted"
	// ConditionReasonDryRun: sent in dry-run mode, logged and never
	// enforced, as asked (status True).
	ConditionReasonDryRun = "DryRun"
	// ConditionReasonPartiallyInvalid: enforced, but values that cannot be
	// enforced made their rules fail closed (status False).
	ConditionReasonPartiallyInvalid = "PartiallyInvalid"
	// ConditionReasonInvalid: not enforced, and values cannot be enforced
	// (status False).
	ConditionReasonInvalid = "Invalid"
	// ConditionReasonPartiallyEnforced: enforced with parts dropped or
	// narrowed; the message says which (status False).
	ConditionReasonPartiallyEnforced = "PartiallyEnforced"
	// ConditionReasonNotEnforced: nothing enforces it; the message says
	// why (status False).
	ConditionReasonNotEnforced = "NotEnforced"
)

// Analysis message types written to status.validationMessages.
var (
	// MsgSchemaValidationError is Istio's IST0106.
	MsgSchemaValidationError = ValidationMessage{Type: MessageType{Name: "SchemaValidationError", Code: "IST0106"},
		Level: "ERROR", DocumentationURL: "https://istio.io/latest/docs/reference/config/analysis/ist0106/"}
	// MsgNotEnforced is ztunnel-go's own: Istio has no code for an object
	// its data plane does not (fully) enforce.
	MsgNotEnforced = ValidationMessage{Type: MessageType{Name: "NotEnforced", Code: "ZTG0001"},
		Level: "WARNING", DocumentationURL: "https://github.com/ztunnel-go/ztunnel-go/blob/main/docs/istio-status.md#ztg0001-notenforced"}
)

// ownedCodes are the validationMessages codes this writer replaces.
var ownedCodes = map[string]bool{MsgSchemaValidationError.Type.Code: true, MsgNotEnforced.Type.Code: true}

// MessageType is AnalysisMessageBase.Type.
type MessageType struct {
	Name string `json:"name,omitempty"`
	Code string `json:"code,omitempty"`
}

// ValidationMessage is one status.validationMessages entry
// (AnalysisMessageBase in its JSON form).
type ValidationMessage struct {
	Type             MessageType `json:"type"`
	Level            string      `json:"level,omitempty"`
	DocumentationURL string      `json:"documentationUrl,omitempty"`
}

// Condition is the Reconciled condition we write.
type Condition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason,omitempty"`
	Message            string `json:"message,omitempty"`
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
	LastTransitionTime string `json:"lastTransitionTime,omitempty"`
}

// IstioStatus is what the control plane owns in one object's status.
type IstioStatus struct {
	Condition Condition
	Messages  []ValidationMessage
}

// BuildStatus turns what became of an object into the status it should
// carry; generation is the object's metadata.generation.
func BuildStatus(ps translate.PolicyStatus, generation int64) IstioStatus {
	byWaypoint := strings.HasPrefix(ps.Message, translate.EnforcedByWaypoint)
	enforced := ps.Sent || byWaypoint
	// A message on an enforced object other than "enforced by waypoint ..."
	// reports something dropped, narrowed or ignored.
	notes := ps.Message != "" && !byWaypoint
	c := Condition{Type: ConditionReconciled, Status: "False", ObservedGeneration: generation}
	var msgs []ValidationMessage
	switch {
	case len(ps.Invalid) > 0 && enforced:
		c.Reason = ConditionReasonPartiallyInvalid
	case len(ps.Invalid) > 0:
		c.Reason = ConditionReasonInvalid
	case !enforced:
		c.Reason = ConditionReasonNotEnforced
	case notes:
		c.Reason = ConditionReasonPartiallyEnforced
	case ps.DryRun:
		c.Status, c.Reason = "True", ConditionReasonDryRun
	default:
		c.Status, c.Reason = "True", ConditionReasonAccepted
	}
	var parts []string
	if ps.Message != "" {
		parts = append(parts, ps.Message)
	}
	if len(ps.Invalid) > 0 {
		msgs = append(msgs, MsgSchemaValidationError)
		if !strings.Contains(ps.Message, ps.Invalid[0]) {
			parts = append(parts, "values that cannot be enforced fail closed: "+strings.Join(ps.Invalid, "; "))
		}
	}
	if c.Status == "False" && c.Reason != ConditionReasonInvalid {
		msgs = append(msgs, MsgNotEnforced)
	}
	if ps.DryRun {
		parts = append(parts, "dry run: node proxies log what it would decide and never enforce it")
	}
	switch {
	case len(parts) > 0:
		c.Message = strings.Join(parts, "; ")
	case c.Status == "True":
		c.Message = "enforced as written"
	}
	return IstioStatus{Condition: c, Messages: msgs}
}

// objectStatus is one object's identity and current status.
type objectStatus struct {
	kind, namespace, name, rv string
	generation                int64
	status                    *metav1alpha1.IstioStatus
}

// statusObjects indexes the kinds that get status by "Kind/ns/name".
func statusObjects(objs *cluster.Objects) map[string]objectStatus {
	out := map[string]objectStatus{}
	add := func(kind string, m metav1.ObjectMeta, st *metav1alpha1.IstioStatus) {
		out[kind+"/"+m.Namespace+"/"+m.Name] = objectStatus{kind: kind, namespace: m.Namespace, name: m.Name,
			rv: m.ResourceVersion, generation: m.Generation, status: st}
	}
	for _, o := range objs.AuthorizationPolicies {
		add("AuthorizationPolicy", o.ObjectMeta, &o.Status)
	}
	for _, o := range objs.PeerAuthentications {
		add("PeerAuthentication", o.ObjectMeta, &o.Status)
	}
	for _, o := range objs.RequestAuthentications {
		add("RequestAuthentication", o.ObjectMeta, &o.Status)
	}
	for _, o := range objs.VirtualServices {
		add("VirtualService", o.ObjectMeta, &o.Status)
	}
	for _, o := range objs.DestinationRules {
		add("DestinationRule", o.ObjectMeta, &o.Status)
	}
	for _, o := range objs.Telemetries {
		add("Telemetry", o.ObjectMeta, &o.Status)
	}
	return out
}

// Unchanged reports whether cur already holds want (the no-write rule):
// our condition with the same status, reason, message and generation, and
// exactly our messages among the codes we own. Times are not compared.
func Unchanged(cur *metav1alpha1.IstioStatus, want IstioStatus) bool {
	var mine *metav1alpha1.IstioCondition
	for _, c := range cur.GetConditions() {
		if c.GetType() == ConditionReconciled {
			if mine != nil {
				return false // duplicates: rewrite as one
			}
			mine = c
		}
	}
	w := want.Condition
	if mine == nil || mine.GetStatus() != w.Status || mine.GetReason() != w.Reason ||
		mine.GetMessage() != w.Message || mine.GetObservedGeneration() != w.ObservedGeneration {
		return false
	}
	var have []ValidationMessage
	for _, m := range cur.GetValidationMessages() {
		if ownedCodes[m.GetType().GetCode()] {
			have = append(have, fromBase(m))
		}
	}
	return slices.Equal(have, want.Messages)
}

func fromBase(m *analysisv1alpha1.AnalysisMessageBase) ValidationMessage {
	return ValidationMessage{Type: MessageType{Name: m.GetType().GetName(), Code: m.GetType().GetCode()},
		Level: m.GetLevel().String(), DocumentationURL: m.GetDocumentationUrl()}
}

// StatusPatch is the JSON merge patch that moves cur to want: the
// resourceVersion precondition, then status.conditions and
// status.validationMessages with everything we do not own copied through.
// now stamps lastTransitionTime when the condition's status changes.
func StatusPatch(rv string, cur *metav1alpha1.IstioStatus, want IstioStatus, now time.Time) ([]byte, error) {
	conds := []any{}
	c := want.Condition
	c.LastTransitionTime = now.UTC().Format(time.RFC3339)
	for _, old := range cur.GetConditions() {
		if old.GetType() != ConditionReconciled {
			conds = append(conds, old) // istio.io/api's MarshalJSON keeps its JSON form
			continue
		}
		if old.GetStatus() == c.Status && old.GetLastTransitionTime() != nil {
			c.LastTransitionTime = old.GetLastTransitionTime().AsTime().UTC().Format(time.RFC3339)
		}
	}
	conds = append(conds, c)
	msgs := []any{}
	for _, m := range cur.GetValidationMessages() {
		if !ownedCodes[m.GetType().GetCode()] {
			msgs = append(msgs, m)
		}
	}
	for _, m := range want.Messages {
		msgs = append(msgs, m)
	}
	status := map[string]any{"conditions": conds}
	if len(msgs) > 0 {
		status["validationMessages"] = msgs
	} else {
		status["validationMessages"] = nil // merge patch: remove the field
	}
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv},
		"status":   status,
	})
}

// Defaults of IstioConfig.
const (
	DefaultIstioStatusQPS = 10
	// IstioFieldManager names the writer in managedFields.
	IstioFieldManager = "ztunnel-go-status"
	leaderPoll        = 2 * time.Second
)

// IstioConfig configures NewIstio.
type IstioConfig struct {
	// Istio patches the objects' status subresource. Required.
	Istio istioclient.Interface
	// Leading reports whether this replica may write (Writer.Leading).
	// Required.
	Leading func() bool
	// QPS caps writes a second; 0 means DefaultIstioStatusQPS.
	QPS float64
	// Retries lists the write loop on the daemon's readiness page; nil: a
	// Retry of its own that logs to Log.
	Retries *backoff.Set
	// Log: nil means no logging.
	Log *zap.Logger
}

// IstioWriter keeps the Istio objects' status equal to the latest
// translation's. Feed it with Update; Run writes while leading.
type IstioWriter struct {
	cfg  IstioConfig
	log  *zap.Logger
	kick chan struct{}

	mu       sync.Mutex
	objs     *cluster.Objects
	policies []translate.PolicyStatus

	// Run's goroutine only:
	next time.Time // rate limit: earliest next write
	// written: per "Kind/ns/name", what was last written and the
	// resourceVersion it was written over, so that a write the source has
	// not shown yet is not repeated (it would only fail its precondition).
	written map[string]writtenStatus
}

type writtenStatus struct {
	overRV string
	want   IstioStatus
}

// NewIstio validates cfg; nothing is contacted before Run.
func NewIstio(cfg IstioConfig) (*IstioWriter, error) {
	if cfg.Istio == nil || cfg.Leading == nil {
		return nil, errors.New("kubestatus: Istio and Leading are required")
	}
	if cfg.QPS <= 0 {
		cfg.QPS = DefaultIstioStatusQPS
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &IstioWriter{cfg: cfg, log: log, kick: make(chan struct{}, 1), written: map[string]writtenStatus{}}, nil
}

// Update records a translation's objects and statuses (objs must be the
// ones the statuses were computed from). It never blocks.
func (w *IstioWriter) Update(objs *cluster.Objects, policies []translate.PolicyStatus) {
	w.mu.Lock()
	w.objs, w.policies = objs, policies
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Run writes status while this replica leads, until ctx is done. It
// returns nil then.
func (w *IstioWriter) Run(ctx context.Context) error {
	const what = "Istio object status writes"
	policy := backoff.Policy{Initial: 500 * time.Millisecond, Max: maxBackoff}
	retry := backoff.New(what, policy, w.log)
	if w.cfg.Retries != nil {
		retry = w.cfg.Retries.New(what, policy)
	}
	poll := time.NewTicker(leaderPoll)
	defer poll.Stop()
	for {
		var again <-chan time.Time
		if w.cfg.Leading() {
			w.mu.Lock()
			objs, policies := w.objs, w.policies
			w.mu.Unlock()
			if objs != nil {
				if failed, first := w.reconcile(ctx, objs, policies); failed > 0 {
					again = time.After(retry.Failed(fmt.Errorf("%d status writes failed, first: %w", failed, first)))
				} else {
					retry.Succeeded()
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
		case <-again:
		case <-poll.C:
			// Picks up leadership gained since; a no-op write check otherwise.
		}
	}
}

// Reconcile writes the status of every object of objs whose status
// differs from what policies say, and returns how many writes failed.
// Objects without a PolicyStatus are left alone. It stops early when
// this replica stops leading. Run calls it; it must not run concurrently.
func (w *IstioWriter) Reconcile(ctx context.Context, objs *cluster.Objects, policies []translate.PolicyStatus) (failed int) {
	failed, _ = w.reconcile(ctx, objs, policies)
	return failed
}

// reconcile is Reconcile; first is the first write error, for the retry
// log (each failure is logged at debug only: the Retry logs once per
// backoff step).
func (w *IstioWriter) reconcile(ctx context.Context, objs *cluster.Objects, policies []translate.PolicyStatus) (failed int, first error) {
	index := statusObjects(objs)
	for key, ws := range w.written {
		if o, ok := index[key]; !ok || o.rv != ws.overRV {
			delete(w.written, key) // the source shows our write (or a newer object)
		}
	}
	for _, ps := range policies {
		key := ps.Kind + "/" + ps.Name
		o, ok := index[key]
		if !ok {
			continue
		}
		want := BuildStatus(ps, o.generation)
		if Unchanged(o.status, want) {
			continue
		}
		if ws, ok := w.written[key]; ok && ws.overRV == o.rv && reflect.DeepEqual(ws.want, want) {
			continue // written; the source has not shown it yet
		}
		if err := w.wait(ctx); err != nil {
			return failed, first
		}
		if !w.cfg.Leading() {
			return failed, first
		}
		err := w.write(ctx, o, want)
		if err == nil {
			w.written[key] = writtenStatus{overRV: o.rv, want: want}
		} else {
			failed++
			if first == nil {
				first = err
			}
			w.log.Debug("writing status failed; will retry", zap.String("kind", o.kind),
				zap.String("name", o.namespace+"/"+o.name), zap.Error(err))
		}
	}
	return failed, first
}

// wait spaces writes 1/QPS apart.
func (w *IstioWriter) wait(ctx context.Context) error {
	now := time.Now()
	if d := w.next.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		now = w.next
	}
	w.next = now.Add(time.Duration(float64(time.Second) / w.cfg.QPS))
	return nil
}

func (w *IstioWriter) write(ctx context.Context, o objectStatus, want IstioStatus) error {
	body, err := StatusPatch(o.rv, o.status, want, time.Now())
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: IstioFieldManager}
	c := w.cfg.Istio
	switch o.kind {
	case "AuthorizationPolicy":
		_, err = c.SecurityV1().AuthorizationPolicies(o.namespace).Patch(ctx, o.name, types.MergePatchType, body, opts, "status")
	case "PeerAuthentication":
		_, err = c.SecurityV1().PeerAuthentications(o.namespace).Patch(ctx, o.name, types.MergePatchType, body, opts, "status")
	case "RequestAuthentication":
		_, err = c.SecurityV1().RequestAuthentications(o.namespace).Patch(ctx, o.name, types.MergePatchType, body, opts, "status")
	case "VirtualService":
		_, err = c.NetworkingV1().VirtualServices(o.namespace).Patch(ctx, o.name, types.MergePatchType, body, opts, "status")
	case "DestinationRule":
		_, err = c.NetworkingV1().DestinationRules(o.namespace).Patch(ctx, o.name, types.MergePatchType, body, opts, "status")
	case "Telemetry":
		_, err = c.TelemetryV1().Telemetries(o.namespace).Patch(ctx, o.name, types.MergePatchType, body, opts, "status")
	default:
		return fmt.Errorf("kubestatus: no status for kind %s", o.kind)
	}
	switch {
	case err == nil:
		w.log.Info("status written", zap.String("kind", o.kind), zap.String("name", o.namespace+"/"+o.name),
			zap.String("reason", want.Condition.Reason))
		return nil
	case apierrors.IsNotFound(err):
		return nil // deleted meanwhile
	case apierrors.IsConflict(err):
		// Our read was stale; the source's next version is written.
		return fmt.Errorf("kubestatus: %s %s/%s changed since read: %w", o.kind, o.namespace, o.name, err)
	default:
		return fmt.Errorf("kubestatus: patch %s %s/%s status: %w", o.kind, o.namespace, o.name, err)
	}
}
