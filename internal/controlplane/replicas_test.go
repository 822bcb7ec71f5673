package controlplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/kube"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/kubestatus"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/kubeapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// replica is one control-plane instance in Kubernetes mode.
type replica struct {
	name   string
	cp     *ControlPlane
	status *kubestatus.Writer
	stop   context.CancelFunc
	done   sync.WaitGroup
}

// served returns the addresses the replica serves for service key, sorted.
func (r *replica) served(key string) []string {
	res := r.cp.Result()
	if res == nil {
		return nil
	}
	a, ok := res.Addresses.Get(key)
	if !ok {
		return nil
	}
	var out []string
	for _, na := range a.GetService().GetAddresses() {
		if ip, ok := netip.AddrFromSlice(na.GetAddress()); ok {
			out = append(out, ip.String())
		}
	}
	slices.Sort(out)
	return out
}

// TestReplicasServeTheSameServiceEntryAddresses: two control planes on one
// real API server. Only the Lease holder allocates; the other serves what
// status.addresses says and never an address of its own; after the leader
// stops, the other takes the Lease and allocates new hosts itself.
func TestReplicasServeTheSameServiceEntryAddresses(t *testing.T) {
	api := kubeapi.Start(t, kubeapi.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := api.ApplyCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"istio-system", "app"} {
		if err := api.EnsureNamespace(ctx, ns, nil); err != nil {
			t.Fatal(err)
		}
	}
	clients, err := kube.NewClients(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	authority, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := caserver.NewNodeTokens(map[string]string{"n1": "t1"})
	if err != nil {
		t.Fatal(err)
	}
	start := func(name string) *replica {
		src, err := kube.New(kube.Config{Clients: clients, Debounce: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		st, err := kubestatus.New(kubestatus.Config{
			Istio: clients.Istio, Kube: clients.Kube, Source: src, Identity: name,
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 300 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		al, err := autoalloc.New(autoalloc.Config{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		cp, err := New(Config{Source: src, CA: authority, Auth: auth, Allocator: al})
		if err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(context.Background())
		r := &replica{name: name, cp: cp, status: st, stop: stop}
		r.done.Add(2)
		go func() { defer r.done.Done(); _ = cp.Run(rctx, lis) }()
		go func() { defer r.done.Done(); _ = st.Run(rctx) }()
		t.Cleanup(func() { r.stop(); r.done.Wait() })
		return r
	}
	replicas := []*replica{start("replica-a"), start("replica-b")}

	ses := clients.Istio.NetworkingV1().ServiceEntries("app")
	createSE := func(name, host string) {
		t.Helper()
		_, err := ses.Create(ctx, &networkingv1.ServiceEntry{
			ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name},
			Spec:       networkingv1alpha3.ServiceEntry{Hosts: []string{host}, Resolution: networkingv1alpha3.ServiceEntry_DNS},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	statusOf := func(name string) []string {
		se, err := ses.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, a := range se.Status.GetAddresses() {
			out = append(out, a.GetValue())
		}
		slices.Sort(out)
		return out
	}
	// watch polls what each live replica serves for key until every one
	// serves the ServiceEntry's status addresses, and returns every
	// non-empty set each replica served on the way. A follower serving
	// anything while status (read after it) is still empty served an
	// address of its own: that fails the test.
	watch := func(live []*replica, seName, key string) (final []string, seen map[string][][]string) {
		t.Helper()
		seen = map[string][][]string{}
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := map[string][]string{}
			leading := map[string]bool{}
			for _, r := range live {
				leading[r.name] = r.status.Leading()
				got[r.name] = r.served(key)
			}
			st := statusOf(seName)
			agree := len(st) > 0
			for _, r := range live {
				g := got[r.name]
				if len(g) > 0 && len(st) == 0 && !leading[r.name] && !r.status.Leading() {
					t.Errorf("follower %s served %v before the leader wrote status", r.name, g)
				}
				if len(g) > 0 && (len(seen[r.name]) == 0 || !slices.Equal(seen[r.name][len(seen[r.name])-1], g)) {
					seen[r.name] = append(seen[r.name], g)
				}
				agree = agree && slices.Equal(g, st)
			}
			if agree {
				return st, seen
			}
			if time.Now().After(deadline) {
				for _, r := range live {
					t.Logf("%s (leading=%v) serves %v", r.name, r.status.Leading(), r.served(key))
				}
				t.Fatalf("replicas did not converge on the status addresses %v of %s", st, seName)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	leader := func(live []*replica) *replica {
		t.Helper()
		var l []*replica
		testkit.EventuallyErr(t, 30*time.Second, "a single leader", func() error {
			l = l[:0]
			for _, r := range live {
				if r.status.Leading() {
					l = append(l, r)
				}
			}
			if len(l) != 1 {
				return fmt.Errorf("%d replicas lead", len(l))
			}
			return nil
		})
		return l[0]
	}

	lead := leader(replicas)
	createSE("ext", "x.example.com")
	final, seen := watch(replicas, "ext", "app/x.example.com")
	if len(final) != 2 {
		t.Errorf("status.addresses = %v, want one IPv4 and one IPv6", final)
	}
	for _, r := range replicas {
		for _, s := range seen[r.name] {
			if !slices.Equal(s, final) {
				t.Errorf("%s (leader %v) served %v, which is not what status says (%v)", r.name, r == lead, s, final)
			}
		}
	}

	// The leader stops (releasing the Lease); the other one takes over and
	// allocates a new host itself.
	lead.stop()
	lead.done.Wait()
	var rest []*replica
	for _, r := range replicas {
		if r != lead {
			rest = append(rest, r)
		}
	}
	next := leader(rest)
	createSE("ext2", "y.example.com")
	final2, seen2 := watch(rest, "ext2", "app/y.example.com")
	if len(final2) != 2 || slices.Equal(final2, final) {
		t.Errorf("new host's status.addresses = %v, want two addresses other than %v", final2, final)
	}
	for _, s := range seen2[next.name] {
		if !slices.Equal(s, final2) {
			t.Errorf("new leader served %v before status said %v", s, final2)
		}
	}
	if got := next.served("app/x.example.com"); !slices.Equal(got, final) {
		t.Errorf("new leader serves %v for the first host, want %v", got, fmt.Sprint(final))
	}
}
