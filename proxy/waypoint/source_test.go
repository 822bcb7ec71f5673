package waypoint

import (
	"net/netip"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/statetest"
)

// TestSourcePeerProvesTheWorkload: the client's workload uid, which
// VirtualService sourceLabels match, is given only when the workload at
// the client's address has the peer certificate's identity; baggage that
// names a workload never proves one.
func TestSourcePeerProvesTheWorkload(t *testing.T) {
	cfg := statetest.Config{}
	w := statetest.Workload(cfg, 3, 0)
	wl := w.GetWorkload()
	st := state.NewStore()
	if err := st.ApplyAddresses(map[string]*workloadapi.Address{wl.GetUid(): w}, nil); err != nil {
		t.Fatal(err)
	}
	snap := st.Load()
	ip, _ := netip.AddrFromSlice(wl.GetAddresses()[0])
	own := identity.Identity{TrustDomain: "cluster.local", Namespace: wl.GetNamespace(), ServiceAccount: wl.GetServiceAccount()}
	other := identity.Identity{TrustDomain: "cluster.local", Namespace: wl.GetNamespace(), ServiceAccount: "other"}
	bg := hbone.Baggage{WorkloadName: wl.GetName(), Namespace: wl.GetNamespace()}
	for _, tc := range []struct {
		name string
		ip   netip.Addr
		peer identity.Identity
		want string
	}{
		{"its own address and identity", ip, own, wl.GetUid()},
		{"another identity at its address", ip, other, ""},
		{"its identity at another address", netip.MustParseAddr("10.9.9.9"), own, ""},
		{"no identity", ip, identity.Identity{}, ""},
	} {
		if _, uid := sourcePeer(snap, tc.ip, tc.peer, bg); uid != tc.want {
			t.Errorf("%s: uid %q, want %q", tc.name, uid, tc.want)
		}
	}
}
