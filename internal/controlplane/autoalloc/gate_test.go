package autoalloc

import (
	"testing"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
)

// gateStore is an in-memory Store that is also a Gate.
type gateStore struct {
	st      State
	leading bool
	ch      chan struct{}
}

func (g *gateStore) Load() (State, error)         { return g.st, nil }
func (g *gateStore) Save(st State) error          { g.st = st; return nil }
func (g *gateStore) MayAllocate() bool            { return g.leading }
func (g *gateStore) GateChanged() <-chan struct{} { return g.ch }

// TestFollowerServesOnlyStatus: a replica that may not allocate serves the
// status addresses and nothing of its own, even addresses it allocated
// while it led; leading again, it allocates the rest.
func TestFollowerServesOnlyStatus(t *testing.T) {
	store := &gateStore{leading: true, ch: make(chan struct{}, 1)}
	al, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	if al.Changed() != store.GateChanged() {
		t.Fatal("Changed is not the store's GateChanged channel")
	}
	withStatus := se("a", "with-status", 1, dns, "s.example")
	withStatus.Status.Addresses = []*networkingv1alpha3.ServiceEntryAddress{{Value: "240.240.7.7", Host: "s.example"}}
	mine := se("a", "mine", 2, dns, "m.example")

	// Leading: allocates for the host without status.
	a := mustAllocate(t, al, withStatus, mine)
	if ips := a.Lookup("a", "mine", "m.example"); len(ips) != 2 {
		t.Fatalf("leader: mine got %v, want v4 and v6", ips)
	}
	// Following: only what status says.
	store.leading = false
	a = mustAllocate(t, al, withStatus, mine)
	if ips := a.Lookup("a", "mine", "m.example"); len(ips) != 0 {
		t.Errorf("follower serves its own addresses %v for a host without status", ips)
	}
	if ips := a.Lookup("a", "with-status", "s.example"); len(ips) != 1 || ips[0].String() != "240.240.7.7" {
		t.Errorf("follower: with-status got %v, want exactly the status address 240.240.7.7", ips)
	}
	if n := len(a.List()); n != 1 {
		t.Errorf("follower lists %d allocations, want 1", n)
	}
	// Leading again: the host without status gets an address.
	store.leading = true
	a = mustAllocate(t, al, withStatus, mine)
	if ips := a.Lookup("a", "mine", "m.example"); len(ips) != 2 {
		t.Errorf("new leader: mine got %v, want v4 and v6", ips)
	}
	// A Store without Gate always allocates and has no Changed channel.
	plain, _ := New(Config{})
	if plain.Changed() != nil {
		t.Error("allocator without a Gate store has a Changed channel")
	}
}
