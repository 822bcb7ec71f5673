package kubestatus

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	analysisv1alpha1 "istio.io/api/analysis/v1alpha1"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	istiofake "istio.io/client-go/pkg/clientset/versioned/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

const badField = "spec.rules[0].from[0].source.ipBlocks[0]: \"10.1.0.0/33\" is not an IP address or CIDR"

func TestBuildIstioStatus(t *testing.T) {
	tests := []struct {
		name       string
		ps         translate.PolicyStatus
		status     string
		reason     string
		msgHas     string
		validation []ValidationMessage
	}{
		{name: "clean node policy", ps: translate.PolicyStatus{Sent: true}, status: "True", reason: ConditionReasonAccepted, msgHas: "enforced as written"},
		{name: "clean waypoint policy", ps: translate.PolicyStatus{Message: translate.EnforcedByWaypoint + "ns/wp"},
			status: "True", reason: ConditionReasonAccepted, msgHas: "ns/wp"},
		{name: "dry run", ps: translate.PolicyStatus{Sent: true, DryRun: true}, status: "True", reason: ConditionReasonDryRun, msgHas: "never enforce"},
		{name: "invalid value, sent narrowed", ps: translate.PolicyStatus{Sent: true, Invalid: []string{badField}},
			status: "False", reason: ConditionReasonPartiallyInvalid, msgHas: badField, validation: []ValidationMessage{MsgSchemaValidationError, MsgNotEnforced}},
		{name: "invalid value, not sent", ps: translate.PolicyStatus{Message: "no waypoint", Invalid: []string{badField}},
			status: "False", reason: ConditionReasonInvalid, msgHas: badField, validation: []ValidationMessage{MsgSchemaValidationError}},
		{name: "invalid value already in the message", ps: translate.PolicyStatus{
			Message: translate.EnforcedByWaypoint + "ns/wp; values that cannot be enforced fail closed: " + badField, Invalid: []string{badField}},
			status: "False", reason: ConditionReasonPartiallyInvalid, msgHas: badField, validation: []ValidationMessage{MsgSchemaValidationError, MsgNotEnforced}},
		{name: "not sent", ps: translate.PolicyStatus{Message: "action CUSTOM is not supported by node proxies; not sent"},
			status: "False", reason: ConditionReasonNotEnforced, msgHas: "CUSTOM", validation: []ValidationMessage{MsgNotEnforced}},
		{name: "sent with parts ignored", ps: translate.PolicyStatus{Sent: true, Message: "an older PeerAuthentication without selector in this namespace wins; ignored"},
			status: "False", reason: ConditionReasonPartiallyEnforced, msgHas: "older", validation: []ValidationMessage{MsgNotEnforced}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BuildStatus(tt.ps, 7)
			c := got.Condition
			if c.Type != ConditionReconciled || c.Status != tt.status || c.Reason != tt.reason || c.ObservedGeneration != 7 {
				t.Fatalf("condition %+v, want %s/%s gen 7", c, tt.status, tt.reason)
			}
			if !strings.Contains(c.Message, tt.msgHas) {
				t.Fatalf("message %q lacks %q", c.Message, tt.msgHas)
			}
			if strings.Count(c.Message, badField) > 1 {
				t.Fatalf("message repeats the field: %q", c.Message)
			}
			if !reflect.DeepEqual(got.Messages, tt.validation) {
				t.Fatalf("validation messages %v, want %v", got.Messages, tt.validation)
			}
		})
	}
}

// current renders what the API server would hold after we wrote want,
// plus another writer's condition and message.
func current(want IstioStatus, ltt time.Time) *metav1alpha1.IstioStatus {
	st := &metav1alpha1.IstioStatus{Conditions: []*metav1alpha1.IstioCondition{
		{Type: "ZtunnelAccepted", Status: "True", Reason: "Accepted"},
		{Type: want.Condition.Type, Status: want.Condition.Status, Reason: want.Condition.Reason,
			Message: want.Condition.Message, ObservedGeneration: want.Condition.ObservedGeneration, LastTransitionTime: timestamppb.New(ltt)},
	}}
	st.ValidationMessages = append(st.ValidationMessages, &analysisv1alpha1.AnalysisMessageBase{
		Type:  &analysisv1alpha1.AnalysisMessageBase_Type{Name: "ConflictingMeshGatewayVirtualServiceHosts", Code: "IST0109"},
		Level: analysisv1alpha1.AnalysisMessageBase_ERROR})
	for _, m := range want.Messages {
		st.ValidationMessages = append(st.ValidationMessages, &analysisv1alpha1.AnalysisMessageBase{
			Type:             &analysisv1alpha1.AnalysisMessageBase_Type{Name: m.Type.Name, Code: m.Type.Code},
			Level:            analysisv1alpha1.AnalysisMessageBase_Level(analysisv1alpha1.AnalysisMessageBase_Level_value[m.Level]),
			DocumentationUrl: m.DocumentationURL,
		})
	}
	return st
}

// TestIstioStatusUnchanged is the no-write rule: a status that already
// holds what we would write (whatever else it holds) is left alone; any
// difference in what we own is written.
func TestIstioStatusUnchanged(t *testing.T) {
	bad := BuildStatus(translate.PolicyStatus{Sent: true, Invalid: []string{badField}}, 2)
	good := BuildStatus(translate.PolicyStatus{Sent: true}, 2)
	if !Unchanged(current(bad, time.Now()), bad) || !Unchanged(current(good, time.Now()), good) {
		t.Fatal("status already written is written again")
	}
	if Unchanged(&metav1alpha1.IstioStatus{}, good) {
		t.Fatal("empty status counts as written")
	}
	if Unchanged(current(bad, time.Now()), good) {
		t.Fatal("fixed policy keeps its old status")
	}
	if Unchanged(current(good, time.Now()), BuildStatus(translate.PolicyStatus{Sent: true}, 3)) {
		t.Fatal("new generation not recorded")
	}
	stale := current(good, time.Now())
	stale.ValidationMessages = append(stale.ValidationMessages, &analysisv1alpha1.AnalysisMessageBase{
		Type: &analysisv1alpha1.AnalysisMessageBase_Type{Name: "SchemaValidationError", Code: "IST0106"}, Level: analysisv1alpha1.AnalysisMessageBase_ERROR})
	if Unchanged(stale, good) {
		t.Fatal("a left-over message of ours is kept")
	}
	dup := current(good, time.Now())
	dup.Conditions = append(dup.Conditions, dup.Conditions[1])
	if Unchanged(dup, good) {
		t.Fatal("duplicate conditions are kept")
	}
}

// TestIstioStatusPatch: the merge patch carries the resourceVersion, keeps
// other writers' conditions and messages, keeps lastTransitionTime while
// the condition's status stays, and removes our messages when none remain.
func TestIstioStatusPatch(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0.Add(time.Hour)
	bad := BuildStatus(translate.PolicyStatus{Sent: true, Invalid: []string{badField}}, 1)
	good := BuildStatus(translate.PolicyStatus{Sent: true}, 2)
	decode := func(b []byte) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// Fixing the bad policy: status flips, time is now, our messages go.
	b, err := StatusPatch("42", current(bad, t0), good, now)
	if err != nil {
		t.Fatal(err)
	}
	p := decode(b)
	if p["metadata"].(map[string]any)["resourceVersion"] != "42" {
		t.Fatalf("no resourceVersion precondition: %s", b)
	}
	st := p["status"].(map[string]any)
	if _, ok := st["addresses"]; ok {
		t.Fatalf("patch touches status.addresses: %s", b)
	}
	conds := st["conditions"].([]any)
	if len(conds) != 2 || conds[0].(map[string]any)["type"] != "ZtunnelAccepted" {
		t.Fatalf("other conditions not kept: %s", b)
	}
	mine := conds[1].(map[string]any)
	if mine["type"] != ConditionReconciled || mine["status"] != "True" || mine["lastTransitionTime"] != now.Format(time.RFC3339) {
		t.Fatalf("condition %v", mine)
	}
	msgs := st["validationMessages"].([]any)
	if len(msgs) != 1 || msgs[0].(map[string]any)["type"].(map[string]any)["code"] != "IST0109" {
		t.Fatalf("validationMessages %v, want only the other writer's", msgs)
	}
	// Same status, new message text: the transition time stays.
	good2 := good
	good2.Condition.Message = "enforced as written, again"
	b, _ = StatusPatch("43", current(good, t0), good2, now)
	mine = decode(b)["status"].(map[string]any)["conditions"].([]any)[1].(map[string]any)
	if mine["lastTransitionTime"] != t0.Format(time.RFC3339) {
		t.Fatalf("lastTransitionTime moved without a transition: %v", mine)
	}
	// Nothing else there: validationMessages is removed (null in a merge patch).
	b, _ = StatusPatch("44", &metav1alpha1.IstioStatus{}, good, now)
	st = decode(b)["status"].(map[string]any)
	if v, ok := st["validationMessages"]; !ok || v != nil {
		t.Fatalf("validationMessages not removed: %s", b)
	}
}

// TestIstioStatusNoWrite drives Reconcile against a fake clientset that
// records every call: a status that already matches is never patched, a
// write the source has not shown yet is not repeated, a follower writes
// nothing, and a changed status is patched once through the status
// subresource.
func TestIstioStatusNoWrite(t *testing.T) {
	cs := istiofake.NewSimpleClientset()
	leading := true
	w, err := NewIstio(IstioConfig{Istio: cs, Leading: func() bool { return leading }, QPS: 1000})
	if err != nil {
		t.Fatal(err)
	}
	good := translate.PolicyStatus{Kind: "AuthorizationPolicy", Name: "app/p", Sent: true}
	ap := func(rv string, st IstioStatus) *securityv1.AuthorizationPolicy {
		p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "p", ResourceVersion: rv, Generation: 1}}
		if st.Condition.Type != "" {
			p.Status = *current(st, time.Now())
		}
		return p
	}
	patches := func() int {
		n := 0
		for _, a := range cs.Actions() {
			if a.GetVerb() == "patch" {
				if a.GetSubresource() != "status" {
					t.Fatalf("patch outside the status subresource: %v", a)
				}
				n++
			}
		}
		return n
	}
	ctx := context.Background()
	settled := &cluster.Objects{AuthorizationPolicies: []*securityv1.AuthorizationPolicy{ap("5", BuildStatus(good, 1))}}
	if f := w.Reconcile(ctx, settled, []translate.PolicyStatus{good}); f != 0 || patches() != 0 {
		t.Fatalf("settled status: failed=%d patches=%d", f, patches())
	}
	fresh := &cluster.Objects{AuthorizationPolicies: []*securityv1.AuthorizationPolicy{ap("6", IstioStatus{})}}
	leading = false
	if w.Reconcile(ctx, fresh, []translate.PolicyStatus{good}); patches() != 0 {
		t.Fatal("a follower wrote status")
	}
	leading = true
	// The fake has no such object: the patch is sent, answered NotFound,
	// which counts as done (deleted meanwhile).
	if f := w.Reconcile(ctx, fresh, []translate.PolicyStatus{good}); f != 0 || patches() != 1 {
		t.Fatalf("changed status: failed=%d patches=%d", f, patches())
	}
	if w.Reconcile(ctx, fresh, []translate.PolicyStatus{good}); patches() != 1 {
		t.Fatal("a write not yet seen by the source was repeated")
	}
	bad := good
	bad.Invalid = []string{badField}
	if w.Reconcile(ctx, fresh, []translate.PolicyStatus{bad}); patches() != 2 {
		t.Fatal("a different status for the same read was not written")
	}
	if w.Reconcile(ctx, settled, []translate.PolicyStatus{good}); patches() != 2 {
		t.Fatal("status shown by the source was written again")
	}
}
