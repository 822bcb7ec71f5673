// Package webhook is ztunnel-cp's validating admission webhook (Kubernetes
// mode), as istiod serves one: the API server sends each create or update
// of the kinds the control plane reads (AuthorizationPolicy,
// PeerAuthentication, ServiceEntry, WorkloadEntry) as an AdmissionReview,
// and Handler refuses an object that does not decode strictly or holds a
// value that cannot be enforced, with a message naming the field. What it
// lets through still fails closed in translation; the webhook only moves
// the error to `kubectl apply`.
//
// It decides, it does not serve: the caller runs the TLS server (the API
// server only calls webhooks over HTTPS) and registers a
// ValidatingWebhookConfiguration pointing at it.
package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// Path is where Handler expects AdmissionReviews.
const Path = "/validate"

// maxBody bounds one AdmissionReview (the API server's own request limit
// is 3 MiB per object).
const maxBody = 6 << 20

// Config configures Handler.
type Config struct {
	// RootNamespace holds mesh-wide policies; "" means
	// translate.DefaultRootNamespace.
	RootNamespace string
	// Log: nil means no logging.
	Log *zap.Logger
}

// Handler answers AdmissionReview (admission.k8s.io/v1) POSTs on any path.
func Handler(cfg Config) http.Handler {
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil || len(body) > maxBody {
			http.Error(w, "request body unreadable or too large", http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, fmt.Sprintf("not an AdmissionReview with a request: %v", err), http.StatusBadRequest)
			return
		}
		req := review.Request
		resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
		if req.Operation == admissionv1.Create || req.Operation == admissionv1.Update {
			if problems := Validate(cfg.RootNamespace, req.Object.Raw); len(problems) > 0 {
				msg := strings.Join(problems, "; ")
				resp.Allowed = false
				resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
					Reason: metav1.StatusReasonInvalid, Message: msg}
				log.Info("admission refused", zap.String("kind", req.Kind.Kind), zap.String("namespace", req.Namespace),
					zap.String("name", req.Name), zap.String("problems", msg))
			}
		}
		out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
		if out.APIVersion == "" {
			out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&out)
	})
}

// Validate returns the problems of one object (its JSON, as the API server
// sends it), each naming the object and the field: strict decoding (unknown
// fields, bad enum values), AuthorizationPolicy values that cannot be
// enforced (translate.ValidateAuthorizationPolicy: the node proxies'
// conversion, or the waypoints' for a policy with targetRefs, so exactly
// what the policy's status would call invalid), PeerAuthentication modes
// no Istio release defines or port-level settings Istio rejects, and what
// the control plane refuses in a ServiceEntry, VirtualService,
// DestinationRule, HTTPRoute or GRPCRoute without looking at the rest of
// the cluster (translate.Validate*). An object of any other kind has none.
func Validate(rootNamespace string, raw []byte) []string {
	var objs cluster.Objects
	var out []string
	for _, err := range cluster.Decode("object", raw, &objs) {
		var de *cluster.DocError
		switch {
		case errors.Is(err, cluster.ErrUnsupportedKind):
		case errors.As(err, &de):
			out = append(out, fmt.Sprintf("%s %s: %v", de.Kind, de.Name, de.Err))
		default:
			out = append(out, err.Error())
		}
	}
	for _, ap := range objs.AuthorizationPolicies {
		for _, p := range translate.ValidateAuthorizationPolicy(rootNamespace, ap) {
			out = append(out, fmt.Sprintf("AuthorizationPolicy %s/%s: %s", ap.Namespace, ap.Name, p))
		}
	}
	add := func(kind, ns, name string, problems []string) {
		for _, p := range problems {
			out = append(out, fmt.Sprintf("%s %s/%s: %s", kind, ns, name, p))
		}
	}
	for _, se := range objs.ServiceEntries {
		add("ServiceEntry", se.Namespace, se.Name, translate.ValidateServiceEntry(se))
	}
	for _, v := range objs.VirtualServices {
		add("VirtualService", v.Namespace, v.Name, translate.ValidateVirtualService(v))
	}
	for _, d := range objs.DestinationRules {
		add("DestinationRule", d.Namespace, d.Name, translate.ValidateDestinationRule(d))
	}
	for _, r := range objs.HTTPRoutes {
		add("HTTPRoute", r.Namespace, r.Name, translate.ValidateHTTPRoute(r))
	}
	for _, r := range objs.GRPCRoutes {
		add("GRPCRoute", r.Namespace, r.Name, translate.ValidateGRPCRoute(r))
	}
	for _, pa := range objs.PeerAuthentications {
		for _, p := range translate.ValidatePeerAuthentication(pa) {
			out = append(out, fmt.Sprintf("PeerAuthentication %s/%s: %s", pa.Namespace, pa.Name, p))
		}
		if pa.Spec.Selector == nil && len(pa.Spec.PortLevelMtls) > 0 {
			out = append(out, fmt.Sprintf("PeerAuthentication %s/%s: spec.portLevelMtls: requires spec.selector", pa.Namespace, pa.Name))
		}
		for _, port := range slices.Sorted(maps.Keys(pa.Spec.PortLevelMtls)) {
			if port == 0 || port > 65535 {
				out = append(out, fmt.Sprintf("PeerAuthentication %s/%s: spec.portLevelMtls[%d]: port must be 1-65535", pa.Namespace, pa.Name, port))
			}
		}
	}
	return out
}
