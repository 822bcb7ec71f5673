package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"go.uber.org/zap"
)

const prevResult100 = `{"cniVersion":"1.0.0",
 "interfaces":[{"name":"eth0","sandbox":"/var/run/netns/pod"}],
 "ips":[{"interface":0,"address":"10.244.1.7/24","gateway":"10.244.1.1"},{"address":"fd00::7/64"}]}`

func confJSON(extra string) string {
	return `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"ztunnel-cni"` + extra + `,"prevResult":` + prevResult100 + `}`
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    podArgs
		wantErr bool
	}{
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=mesh;K8S_POD_NAME=app-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
			podArgs{Name: "app-1", Namespace: "mesh", UID: "u-1"}, false},
		{"K8S_POD_NAMESPACE=mesh;K8S_POD_NAME=app-1", podArgs{Name: "app-1", Namespace: "mesh"}, false},
		{"", podArgs{}, false},
		{"K8S_POD_NAME=a=b", podArgs{Name: "a=b"}, false},
		{"K8S_POD_NAME", podArgs{}, true},
	} {
		got, err := parseArgs(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseArgs(%q) = %+v, %v; want %+v, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseConfig(t *testing.T) {
	conf, prev, err := ParseConfig([]byte(confJSON(`,"exclude_namespaces":["kube-system"],"log_level":"debug"`)))
	if err != nil {
		t.Fatal(err)
	}
	if conf.AgentSocket != DefaultAgentSocket || !conf.ambientEnabled() || conf.LogLevel != "debug" ||
		!reflect.DeepEqual(conf.ExcludeNamespaces, []string{"kube-system"}) || prev == nil {
		t.Fatalf("conf %+v prev %v", conf, prev)
	}
	conf, _, err = ParseConfig([]byte(confJSON(`,"ambient_enabled":false,"agent_socket":"/run/a.sock"`)))
	if err != nil || conf.ambientEnabled() || conf.AgentSocket != "/run/a.sock" || conf.LogLevel != "info" {
		t.Fatalf("conf %+v err %v", conf, err)
	}

	for _, tc := range []struct {
		name, in, want string
	}{
		{"not JSON", `{"name":`, "bad network configuration"},
		{"wrong type", `{"name":"n","cniVersion":"1.0.0","exclude_namespaces":"kube-system"}`, "bad network configuration"},
		{"no prevResult", `{"cniVersion":"1.0.0","name":"n","type":"ztunnel-cni"}`, "no prevResult"},
		{"bad prevResult", `{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":"nope"}]}}`, "bad prevResult"},
		{"bad log level", confJSON(`,"log_level":"loud"`), "log_level"},
	} {
		if _, _, err := ParseConfig([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

func TestAddRequestFromPrevResult(t *testing.T) {
	_, prev, err := ParseConfig([]byte(confJSON("")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := addRequest(prev, podArgs{Name: "app-1", Namespace: "mesh", UID: "u-1"}, "/var/run/netns/pod")
	if err != nil {
		t.Fatal(err)
	}
	want := AddRequest{Netns: "/var/run/netns/pod", PodName: "app-1", PodNamespace: "mesh", PodUID: "u-1", IPs: []PodIP{
		{Interface: "eth0", Address: netip.MustParsePrefix("10.244.1.7/24"), Gateway: netip.MustParseAddr("10.244.1.1")},
		{Address: netip.MustParsePrefix("fd00::7/64")},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// fakeSource answers from a script: the pod appears after `after` lookups.
type fakeSource struct {
	pod     *corev1.Pod
	ns      *corev1.Namespace
	after   int
	err     error
	lookups int
}

func (f *fakeSource) Lookup(_ context.Context, namespace, name string) (*corev1.Pod, *corev1.Namespace, error) {
	f.lookups++
	if f.err != nil {
		return nil, nil, f.err
	}
	if f.pod == nil || f.lookups <= f.after {
		return nil, f.ns, fmt.Errorf("fake: %s/%s: %w", namespace, name, ErrPodNotFound)
	}
	return f.pod, f.ns, nil
}

func TestDecide(t *testing.T) {
	ambientNS := namespace("mesh", map[string]string{LabelDataplaneMode: DataplaneModeAmbient})
	plainNS := namespace("plain", nil)
	meshPod := pod("mesh", "app", nil, nil)
	meshPod.UID = types.UID("u-1")
	for _, tc := range []struct {
		name        string
		src         *fakeSource
		args        podArgs
		want        bool
		wantErr     string
		wantLookups int
	}{
		{"ambient pod", &fakeSource{pod: meshPod, ns: ambientNS}, podArgs{"app", "mesh", "u-1"}, true, "", 1},
		{"pod shows up on the third lookup", &fakeSource{pod: meshPod, ns: ambientNS, after: 2}, podArgs{"app", "mesh", ""}, true, "", 3},
		{"plain pod", &fakeSource{pod: pod("plain", "web", nil, nil), ns: plainNS}, podArgs{"web", "plain", ""}, false, "", 1},
		{"missing pod in ambient namespace fails closed", &fakeSource{ns: ambientNS}, podArgs{"app", "mesh", ""}, false, "namespace is ambient", 3},
		{"missing pod in plain namespace is not ambient", &fakeSource{ns: plainNS}, podArgs{"web", "plain", ""}, false, "", 3},
		{"missing pod and namespace is not ambient", &fakeSource{}, podArgs{"web", "plain", ""}, false, "", 3},
		{"older pod of the same name is not this pod", &fakeSource{pod: meshPod, ns: ambientNS}, podArgs{"app", "mesh", "u-2"}, false, "namespace is ambient", 3},
		{"unreadable source fails closed", &fakeSource{err: errors.New("permission denied")}, podArgs{"app", "mesh", ""}, false, "permission denied", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &adder{log: zap.NewNop(), src: tc.src, attempts: 3, interval: time.Millisecond}
			got, reason, err := a.decide(context.Background(), &Config{}, tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "retried") {
					t.Fatalf("err %v, want one mentioning %q and the retry", err, tc.wantErr)
				}
			} else if err != nil || got != tc.want {
				t.Fatalf("decide = %v (%s), %v; want %v", got, reason, err, tc.want)
			}
			if tc.src.lookups != tc.wantLookups {
				t.Fatalf("%d lookups, want %d", tc.src.lookups, tc.wantLookups)
			}
		})
	}
}
