package translate

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// TestWaypointInboundBinding: ambient.istio.io/waypoint-inbound-binding on
// a waypoint's GatewayClass, overridden by its Gateway, becomes the
// waypoint pods' application_tunnel (the sandwich: PROXY v2 on that port
// from their node proxy); pods of a waypoint without one, and other pods,
// get none; an invalid value is warned about and ignored.
func TestWaypointInboundBinding(t *testing.T) {
	gw := func(name, ip string, annotations map[string]string) *gatewayv1.Gateway {
		g := weightedGW("shop", name, ip)
		g.Annotations = annotations
		return g
	}
	pod := func(name, gateway, ip string) *corev1.Pod {
		labels := map[string]string{}
		if gateway != "" {
			labels[LabelGatewayName] = gateway
		}
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "1", UID: types.UID("pod-" + name), Labels: labels},
			Spec:       corev1.PodSpec{NodeName: "node0", ServiceAccountName: name},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	objs := &cluster.Objects{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop", ResourceVersion: "1",
			Labels: map[string]string{LabelDataplaneMode: "ambient"}}}},
		GatewayClasses: []*gatewayv1.GatewayClass{{ObjectMeta: metav1.ObjectMeta{Name: WaypointClass, ResourceVersion: "1",
			Annotations: map[string]string{AnnotationWaypointInboundBinding: "PROXY/15088"}},
			Spec: gatewayv1.GatewayClassSpec{ControllerName: "istio.io/waypoint-controller"}}},
		Gateways: []*gatewayv1.Gateway{
			gw("from-class", "10.96.60.1", nil),
			gw("own", "10.96.60.2", map[string]string{AnnotationWaypointInboundBinding: "PROXY"}),
			gw("plain", "10.96.60.3", map[string]string{AnnotationWaypointInboundBinding: "NONE/15009"}),
			gw("bad", "10.96.60.4", map[string]string{AnnotationWaypointInboundBinding: "HTTP/80"}),
			gw("badport", "10.96.60.5", map[string]string{AnnotationWaypointInboundBinding: "PROXY/99999"}),
		},
		Pods: []*corev1.Pod{
			pod("from-class-0", "from-class", "10.0.5.1"),
			pod("own-0", "own", "10.0.5.2"),
			pod("plain-0", "plain", "10.0.5.3"),
			pod("bad-0", "bad", "10.0.5.4"),
			pod("badport-0", "badport", "10.0.5.5"),
			pod("app", "", "10.0.5.6"),
		},
	}
	objs.Sort()
	res := Translate(LocalDefaults(), objs, nil)
	tunnels := map[string]*workloadapi.ApplicationTunnel{}
	for _, a := range res.Addresses.All() {
		if w := a.GetWorkload(); w != nil {
			tunnels[w.GetName()] = w.GetApplicationTunnel()
		}
	}
	for name, want := range map[string]*workloadapi.ApplicationTunnel{
		"from-class-0": {Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088},
		"own-0":        {Protocol: workloadapi.ApplicationTunnel_PROXY},
		"plain-0":      {Protocol: workloadapi.ApplicationTunnel_NONE, Port: 15009},
		"bad-0":        nil,
		"badport-0":    nil,
		"app":          nil,
	} {
		got, ok := tunnels[name]
		if !ok {
			t.Fatalf("pod %s not translated (have %v)", name, tunnels)
		}
		if (got == nil) != (want == nil) || got != nil && (got.GetProtocol() != want.GetProtocol() || got.GetPort() != want.GetPort()) {
			t.Errorf("%s: application tunnel %v, want %v", name, got, want)
		}
	}
	for _, want := range []string{
		"Gateway shop/bad: " + AnnotationWaypointInboundBinding + ` "HTTP/80": protocol must be NONE or PROXY`,
		"Gateway shop/badport: " + AnnotationWaypointInboundBinding + ` "PROXY/99999": port must be 1-65535`,
	} {
		if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.HasPrefix(w, want) }) {
			t.Errorf("no warning %q in %q", want, res.Warnings)
		}
	}
}

// TestWaypointServiceNotBoundToItself: in a namespace bound to a waypoint
// (istio.io/use-waypoint on the Namespace), the waypoint's own Service gets
// no waypoint, whether it is marked by the controller's managed label or
// only by its gateway-name label; so do the waypoint's pods. Otherwise a
// request to the waypoint Service would be sent to the waypoint itself
// and reset. A Service whose gateway-name label names no waypoint, and
// ordinary Services and pods, keep the namespace's waypoint.
func TestWaypointServiceNotBoundToItself(t *testing.T) {
	svc := func(name, ip string, labels map[string]string) *corev1.Service {
		s := weightedSvc(name, ip, labels, nil)
		s.Spec.Ports = []corev1.ServicePort{{Name: "mesh", Port: 15008}}
		return s
	}
	pod := func(name, ip string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "1", UID: types.UID("pod-" + name), Labels: labels},
			Spec:       corev1.PodSpec{NodeName: "node0", ServiceAccountName: name},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
		}
	}
	managed := map[string]string{LabelGatewayManaged: ManagedMeshController, LabelGatewayName: "waypoint"}
	wp := weightedGW("shop", "waypoint", "10.96.70.1")
	wp.Labels = map[string]string{LabelWaypointFor: "all"} // pods too
	objs := &cluster.Objects{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop", ResourceVersion: "1",
			Labels: map[string]string{LabelDataplaneMode: "ambient", LabelUseWaypoint: "waypoint"}}}},
		Gateways: []*gatewayv1.Gateway{wp, weightedGW("shop", "second", "10.96.70.2")},
		Services: []*corev1.Service{
			svc("waypoint", "10.96.70.1", managed),
			svc("second", "10.96.70.2", map[string]string{LabelGatewayName: "second"}),
			svc("ingress", "10.96.70.3", map[string]string{LabelGatewayName: "not-a-waypoint"}),
			svc("app", "10.96.70.4", nil),
		},
		Pods: []*corev1.Pod{
			pod("waypoint-0", "10.0.7.1", managed),
			pod("managed-only-0", "10.0.7.2", map[string]string{LabelGatewayManaged: ManagedMeshController}),
			pod("app-0", "10.0.7.3", nil),
		},
	}
	objs.Sort()
	res := Translate(LocalDefaults(), objs, nil)
	got := map[string]bool{}
	for _, a := range res.Addresses.All() {
		if s := a.GetService(); s != nil {
			got["svc/"+s.GetName()] = s.GetWaypoint() != nil
		}
		if w := a.GetWorkload(); w != nil {
			got["pod/"+w.GetName()] = w.GetWaypoint() != nil
		}
	}
	for name, want := range map[string]bool{
		"svc/waypoint": false, "svc/second": false, "svc/ingress": true, "svc/app": true,
		"pod/waypoint-0": false, "pod/managed-only-0": false, "pod/app-0": true,
	} {
		has, ok := got[name]
		if !ok {
			t.Fatalf("%s not translated (have %v)", name, got)
		}
		if has != want {
			t.Errorf("%s has a waypoint: %v, want %v", name, has, want)
		}
	}
}
