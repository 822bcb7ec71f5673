package xdsserver

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// TestUpdateResourcesPushesOnlyTheChange: a partial update keeps the rest
// of the set, pushes the changed and removed names only, and skips an
// upsert whose encoding did not change.
func TestUpdateResourcesPushesOnlyTheChange(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	a, b, c := "Kubernetes//Pod/default/a", "Kubernetes//Pod/default/b", "Kubernetes//Pod/default/c"
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{
		a: workload(a, "10.1.0.1"), b: workload(b, "10.1.0.2"),
	}))
	srv.SetResources(xds.AuthorizationType, nil)
	cl := startClient(t, srv.addr)
	waitClosed(t, "Synced", cl.Synced())
	before := cl.sink.callCount()

	srv.UpdateResources(xds.AddressType, map[string]proto.Message{
		b: workload(b, "10.1.0.2"), // unchanged: not pushed
		c: workload(c, "10.1.0.3"),
	}, []string{a, "never-existed"})
	testkit.Eventually(t, waitTimeout, "client holds b and c only", func() bool {
		return slices.Equal(cl.sink.names(xds.AddressType), []string{b, c})
	})
	var pushed, removed []string
	for _, call := range cl.sink.callsSince(before) {
		if call.typeURL == xds.AddressType {
			pushed = append(pushed, call.upserts...)
			removed = append(removed, call.removes...)
		}
	}
	if !slices.Equal(pushed, []string{c}) || !slices.Equal(removed, []string{a}) {
		t.Errorf("pushed %v, removed %v; want [%s] and [%s]", pushed, removed, c, a)
	}
	if got := srv.Versions(xds.AddressType); len(got) != 2 || got[b] == "" || got[c] == "" {
		t.Errorf("server versions = %v, want b and c", got)
	}
}

// TestAddressNamesSubscribesOnlyThose: a client with AddressNames holds
// and is pushed only those names.
func TestAddressNamesSubscribesOnlyThose(t *testing.T) {
	srv := startServer(t, "127.0.0.1:0")
	a, b := "Kubernetes//Pod/default/a", "Kubernetes//Pod/default/b"
	srv.SetResources(xds.AddressType, addrSet(map[string]*workloadapi.Address{a: workload(a, "10.1.0.1"), b: workload(b, "10.1.0.2")}))
	srv.SetResources(xds.AuthorizationType, nil)
	cl := startClient(t, srv.addr, func(c *xds.ClientConfig) { c.AddressNames = []string{a} })
	waitClosed(t, "Synced", cl.Synced())
	if got := cl.sink.names(xds.AddressType); !slices.Equal(got, []string{a}) {
		t.Fatalf("holds %v, want only %s", got, a)
	}
	before := cl.sink.callCount()
	srv.UpdateResources(xds.AddressType, map[string]proto.Message{b: workload(b, "10.1.0.9"), a: workload(a, "10.1.0.8")}, nil)
	testkit.Eventually(t, waitTimeout, "a updated", func() bool {
		w := cl.sink.address(a).GetWorkload()
		return w != nil && len(w.Addresses) == 1 && w.Addresses[0][3] == 8
	})
	for _, call := range cl.sink.callsSince(before) {
		if slices.Contains(call.upserts, b) {
			t.Errorf("pushed %s, which the client did not subscribe to", b)
		}
	}
}
