package translate

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

func weightedGW(ns, name, ip string) *gatewayv1.Gateway {
	return &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: "1"},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: WaypointClass,
			Listeners: []gatewayv1.Listener{{Name: "mesh", Port: 15008, Protocol: "HBONE"}}},
		Status: gatewayv1.GatewayStatus{Addresses: []gatewayv1.GatewayStatusAddress{{Value: ip}}},
	}
}

func weightedSvc(name, ip string, labels, annotations map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "1", UID: types.UID("svc-shop-" + name),
			Labels: labels, Annotations: annotations},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
}

// TestWeightedWaypointCanary: istio.io/use-waypoint-canary and the weight
// annotation (Istio 1.31) become Service.weighted_waypoints = [{primary,
// 100-w}, {canary, w}] with the primary kept in waypoint; the node proxy's
// state takes them; the canary waypoint's config serves the service (or
// it would refuse its share); invalid input leaves the service on its
// primary with a warning.
func TestWeightedWaypointCanary(t *testing.T) {
	const (
		stableIP = "10.96.50.1"
		canaryIP = "10.96.50.2"
	)
	canary := func(weight string) map[string]string {
		if weight == "" {
			return nil
		}
		return map[string]string{AnnotationUseWaypointCanaryWeight: weight}
	}
	bind := map[string]string{LabelUseWaypoint: "stable", LabelUseWaypointCanary: "canary"}
	objs := &cluster.Objects{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "shop", ResourceVersion: "1",
			Labels: map[string]string{LabelDataplaneMode: "ambient"}}}},
		Gateways: []*gatewayv1.Gateway{weightedGW("shop", "stable", stableIP), weightedGW("shop", "canary", canaryIP)},
		Services: []*corev1.Service{
			weightedSvc("five", "10.96.0.1", bind, canary("5")),
			weightedSvc("default-zero", "10.96.0.2", bind, nil),
			weightedSvc("promoted", "10.96.0.3", bind, canary("100")),
			weightedSvc("bad-weight", "10.96.0.4", bind, canary("7.5")),
			weightedSvc("too-heavy", "10.96.0.5", bind, canary("101")),
			weightedSvc("no-primary", "10.96.0.6", map[string]string{LabelUseWaypointCanary: "canary"}, canary("5")),
			weightedSvc("unknown-canary", "10.96.0.7", map[string]string{LabelUseWaypoint: "stable", LabelUseWaypointCanary: "nope"}, canary("5")),
			weightedSvc("plain", "10.96.0.8", map[string]string{LabelUseWaypoint: "stable"}, nil),
		},
	}
	objs.Sort()
	snap := nodeState(t, objs)
	stable, can := netip.MustParseAddr(stableIP), netip.MustParseAddr(canaryIP)
	set := func(s *state.Service) string {
		var parts []string
		for _, ww := range s.WeightedWaypoints {
			name := ww.Destination.Address.IP.String()
			switch ww.Destination.Address.IP {
			case stable:
				name = "stable"
			case can:
				name = "canary"
			}
			parts = append(parts, name+"="+strconv.FormatUint(uint64(ww.Weight), 10))
		}
		return strings.Join(parts, ",")
	}
	for name, want := range map[string]string{
		"five":           "stable=95,canary=5",
		"default-zero":   "stable=100,canary=0",
		"promoted":       "stable=0,canary=100",
		"bad-weight":     "",
		"too-heavy":      "",
		"no-primary":     "",
		"unknown-canary": "",
		"plain":          "",
	} {
		s := snap.ServiceByHost("shop/" + name + ".shop.svc.cluster.local")
		if s == nil {
			t.Fatalf("service %s missing from node state", name)
		}
		if got := set(s); got != want {
			t.Errorf("%s: weighted waypoints %q, want %q", name, got, want)
		}
		if name != "no-primary" && (s.Waypoint == nil || s.Waypoint.Address.IP != stable) {
			t.Errorf("%s: primary waypoint %+v, want %s kept for older node proxies", name, s.Waypoint, stable)
		}
	}

	res := Translate(LocalDefaults(), objs, nil)
	for _, want := range []string{
		"Service shop/bad-weight: " + AnnotationUseWaypointCanaryWeight + ` "7.5" is not an integer 0-100`,
		"Service shop/too-heavy: " + AnnotationUseWaypointCanaryWeight + ` "101" is not an integer 0-100`,
		"Service shop/no-primary: " + LabelUseWaypointCanary + " without a usable " + LabelUseWaypoint,
		"Service shop/unknown-canary: " + LabelUseWaypointCanary + " refers to waypoint shop/nope",
	} {
		if !slices.ContainsFunc(res.Warnings, func(w string) bool { return strings.HasPrefix(w, want) }) {
			t.Errorf("no warning %q in %q", want, res.Warnings)
		}
	}

	// The canary waypoint is configured for the services that list it
	// (weight 0 included), and only those.
	cfgs, _ := WaypointConfigs(LocalDefaults(), objs, res)
	served := func(key string) []string {
		var out []string
		for _, s := range cfgs[key].GetServices() {
			out = append(out, s.GetName())
		}
		slices.Sort(out)
		return out
	}
	if got, want := served("shop/canary"), []string{"default-zero", "five", "promoted"}; !slices.Equal(got, want) {
		t.Errorf("canary waypoint serves %v, want %v", got, want)
	}
	if got := served("shop/stable"); len(got) != 7 || slices.Contains(got, "no-primary") {
		t.Errorf("stable waypoint serves %v, want every service but no-primary", got)
	}
}
