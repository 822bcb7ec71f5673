package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

func review(t *testing.T, op admissionv1.Operation, obj string) []byte {
	t.Helper()
	raw, err := yaml.YAMLToJSON([]byte(obj))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &admissionv1.AdmissionRequest{UID: "u1", Operation: op, Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler(Config{}))
	defer srv.Close()
	tests := []struct {
		name    string
		op      admissionv1.Operation
		obj     string
		allowed bool
		want    string // substring of the refusal
	}{
		{"valid policy", admissionv1.Create, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ok, namespace: demo}
spec: {action: DENY, rules: [{from: [{source: {ipBlocks: [10.1.0.0/16]}}]}]}`, true, ""},
		{"bad CIDR", admissionv1.Create, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad, namespace: demo}
spec: {action: DENY, rules: [{from: [{source: {ipBlocks: [10.1.0.0/33]}}]}]}`, false,
			`AuthorizationPolicy demo/bad: spec.rules[0].from[0].source.ipBlocks[0]: "10.1.0.0/33" is not a CIDR`},
		{"bad port on update", admissionv1.Update, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad, namespace: demo}
spec: {rules: [{to: [{operation: {notPorts: ["22a"]}}]}]}`, false, `spec.rules[0].to[0].operation.notPorts[0]`},
		{"unknown field", admissionv1.Create, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: typo, namespace: demo}
spec: {rulez: []}`, false, `AuthorizationPolicy demo/typo: spec:`},
		{"port-level mTLS without selector", admissionv1.Create, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: pa, namespace: demo}
spec: {mtls: {mode: STRICT}, portLevelMtls: {"8080": {mode: DISABLE}}}`, false, `spec.portLevelMtls: requires spec.selector`},
		{"unknown mTLS mode", admissionv1.Create, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: pa, namespace: demo}
spec: {mtls: {mode: 9}}`, false, `PeerAuthentication demo/pa: spec.mtls.mode: unknown value 9`},
		{"delete is never refused", admissionv1.Delete, `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: bad, namespace: demo}
spec: {rules: [{to: [{operation: {ports: ["x"]}}]}]}`, true, ""},
		{"other kinds pass", admissionv1.Create, `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: demo}
spec: {hosts: [x]}`, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := http.Post(srv.URL+Path, "application/json", bytes.NewReader(review(t, tc.op, tc.obj)))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var out admissionv1.AdmissionReview
			if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			r := out.Response
			if r == nil || r.UID != "u1" || out.Kind != "AdmissionReview" {
				t.Fatalf("response %+v", out)
			}
			if r.Allowed != tc.allowed {
				t.Fatalf("allowed = %v (%v), want %v", r.Allowed, r.Result, tc.allowed)
			}
			if !tc.allowed && (r.Result == nil || !strings.Contains(r.Result.Message, tc.want)) {
				t.Errorf("refusal %v, want it to contain %q", r.Result, tc.want)
			}
		})
	}
	res, err := http.Post(srv.URL+Path, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("review without request: status %d, want 400", res.StatusCode)
	}
}
