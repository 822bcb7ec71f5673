package plugin

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pod(ns, name string, labels, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, Annotations: annotations}}
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestIsAmbient(t *testing.T) {
	ambientLabel := map[string]string{LabelDataplaneMode: DataplaneModeAmbient}
	noneLabel := map[string]string{LabelDataplaneMode: DataplaneModeNone}
	hostNet := pod("mesh", "h", nil, nil)
	hostNet.Spec.HostNetwork = true
	hostNetLabelled := pod("plain", "h", ambientLabel, nil)
	hostNetLabelled.Spec.HostNetwork = true
	sidecar := map[string]string{AnnotationSidecarStatus: `{"containers":["istio-proxy"]}`}
	opts := Enrollment{ExcludeNamespaces: []string{"kube-system", "mesh-excluded"}}

	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		ns     *corev1.Namespace
		opts   Enrollment
		want   bool
		reason string
	}{
		{"namespace label", pod("mesh", "a", nil, nil), namespace("mesh", ambientLabel), opts, true, reasonNamespaceLabel},
		{"pod label in plain namespace", pod("plain", "a", ambientLabel, nil), namespace("plain", nil), opts, true, reasonPodLabel},
		{"pod label, namespace unknown", pod("plain", "a", ambientLabel, nil), nil, opts, true, reasonPodLabel},
		{"pod label none opts out of ambient namespace", pod("mesh", "a", noneLabel, nil), namespace("mesh", ambientLabel), opts, false, reasonOptOut},
		{"other pod label value in ambient namespace", pod("mesh", "a", map[string]string{LabelDataplaneMode: "sidecar"}, nil), namespace("mesh", ambientLabel), opts, true, reasonNamespaceLabel},
		{"plain pod in plain namespace", pod("plain", "a", nil, nil), namespace("plain", nil), opts, false, reasonNotEnrolled},
		{"namespace label none does not enroll", pod("plain", "a", nil, nil), namespace("plain", noneLabel), opts, false, reasonNotEnrolled},
		{"namespace unknown", pod("plain", "a", nil, nil), nil, opts, false, reasonNotEnrolled},
		{"hostNetwork in ambient namespace", hostNet, namespace("mesh", ambientLabel), opts, false, reasonHostNetwork},
		{"hostNetwork with pod label", hostNetLabelled, nil, opts, false, reasonHostNetwork},
		{"sidecar-injected in ambient namespace", pod("mesh", "a", nil, sidecar), namespace("mesh", ambientLabel), opts, false, reasonSidecar},
		{"sidecar-injected with pod label", pod("plain", "a", ambientLabel, sidecar), nil, opts, false, reasonSidecar},
		{"excluded namespace labelled ambient", pod("mesh-excluded", "a", nil, nil), namespace("mesh-excluded", ambientLabel), opts, false, reasonExcludedNamespace},
		{"excluded namespace beats pod label", pod("kube-system", "a", ambientLabel, nil), nil, opts, false, reasonExcludedNamespace},
		{"node proxy pod in ambient system namespace", pod(DefaultSystemNamespace, "ztunnel-x", map[string]string{"app": "ztunnel"}, nil), namespace(DefaultSystemNamespace, ambientLabel), opts, false, reasonMeshComponent},
		{"agent pod in custom system namespace", pod("mesh-sys", "cni-x", map[string]string{"app": "ztunnel-cni", LabelDataplaneMode: DataplaneModeAmbient}, nil), nil, Enrollment{SystemNamespace: "mesh-sys"}, false, reasonMeshComponent},
		{"app=ztunnel outside the system namespace is an ordinary pod", pod("mesh", "z", map[string]string{"app": "ztunnel"}, nil), namespace("mesh", ambientLabel), opts, true, reasonNamespaceLabel},
		{"nil pod", nil, namespace("mesh", ambientLabel), opts, false, reasonNoPod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := IsAmbient(tc.pod, tc.ns, tc.opts)
			if got != tc.want || reason != tc.reason {
				t.Fatalf("IsAmbient = %v (%s), want %v (%s)", got, reason, tc.want, tc.reason)
			}
		})
	}
}

func TestNamespaceAmbient(t *testing.T) {
	opts := Enrollment{ExcludeNamespaces: []string{"excluded"}}
	for _, tc := range []struct {
		ns   string
		obj  *corev1.Namespace
		want bool
	}{
		{"mesh", namespace("mesh", map[string]string{LabelDataplaneMode: DataplaneModeAmbient}), true},
		{"plain", namespace("plain", nil), false},
		{"unknown", nil, false},
		{"excluded", namespace("excluded", map[string]string{LabelDataplaneMode: DataplaneModeAmbient}), false},
	} {
		if got := namespaceAmbient(tc.ns, tc.obj, opts); got != tc.want {
			t.Errorf("namespaceAmbient(%s) = %v, want %v", tc.ns, got, tc.want)
		}
	}
}
