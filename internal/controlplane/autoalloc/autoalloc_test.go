package autoalloc

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func se(ns, name string, age int, res networkingv1alpha3.ServiceEntry_Resolution, hosts ...string) *networkingv1.ServiceEntry {
	s := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute)),
	}}
	s.Spec.Hosts = hosts
	s.Spec.Resolution = res
	return s
}

const dns = networkingv1alpha3.ServiceEntry_DNS

func lookup(t *testing.T, a *Allocations, ns, name, host string) (v4, v6 string) {
	t.Helper()
	ips := a.Lookup(ns, name, host)
	if len(ips) != 2 {
		t.Fatalf("%s/%s/%s: got %v, want one v4 and one v6", ns, name, host, ips)
	}
	return ips[0].String(), ips[1].String()
}

func mustAllocate(t *testing.T, al *Allocator, ses ...*networkingv1.ServiceEntry) *Allocations {
	t.Helper()
	a, err := al.Allocate(ses)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestEligible(t *testing.T) {
	withAddr := se("ns", "a", 0, dns, "a.com")
	withAddr.Spec.Addresses = []string{"1.2.3.4"}
	optOut := se("ns", "b", 0, dns, "b.com")
	optOut.Labels = map[string]string{LabelEnableAutoallocate: "false"}
	tests := []struct {
		name string
		se   *networkingv1.ServiceEntry
		host string
		want bool
	}{
		{"dns", se("ns", "x", 0, dns, "x.com"), "x.com", true},
		{"static", se("ns", "x", 0, networkingv1alpha3.ServiceEntry_STATIC, "x.com"), "x.com", true},
		{"none", se("ns", "x", 0, networkingv1alpha3.ServiceEntry_NONE, "x.com"), "x.com", false},
		{"spec addresses", withAddr, "a.com", false},
		{"opted out", optOut, "b.com", false},
		{"wildcard dns", se("ns", "x", 0, dns, "*.x.com"), "*.x.com", false},
		{"wildcard dynamic", se("ns", "x", 0, networkingv1alpha3.ServiceEntry_DYNAMIC_DNS, "*.x.com"), "*.x.com", true},
	}
	for _, tc := range tests {
		if got := Eligible(tc.se, tc.host); got != tc.want {
			t.Errorf("%s: Eligible = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSequentialAndOrderIndependent(t *testing.T) {
	a1, b1, c1 := se("ns", "a", 1, dns, "a.com"), se("ns", "b", 2, dns, "b.com", "b2.com"), se("other", "c", 3, dns, "c.com")
	al, _ := New(Config{})
	x := mustAllocate(t, al, c1, b1, a1)
	// Oldest first, hosts in order.
	want := map[string][2]string{
		"ns/a/a.com":    {"240.240.0.1", "2001:2::1"},
		"ns/b/b.com":    {"240.240.0.2", "2001:2::2"},
		"ns/b/b2.com":   {"240.240.0.3", "2001:2::3"},
		"other/c/c.com": {"240.240.0.4", "2001:2::4"},
	}
	for _, a := range x.List() {
		if w := want[a.Key()]; a.V4.String() != w[0] || a.V6.String() != w[1] {
			t.Errorf("%s = %s %s, want %v", a.Key(), a.V4, a.V6, w)
		}
	}
	// A fresh allocator given another order computes the same.
	al2, _ := New(Config{})
	y := mustAllocate(t, al2, b1, a1, c1)
	if len(y.List()) != len(x.List()) {
		t.Fatalf("different sizes")
	}
	for i := range x.List() {
		if x.List()[i] != y.List()[i] {
			t.Errorf("order changed allocation: %v vs %v", x.List()[i], y.List()[i])
		}
	}
	// Adding a new SE does not move existing ones, even if it is older.
	older := se("aaa", "old", 0, dns, "old.com")
	z := mustAllocate(t, al, older, a1, b1, c1)
	if v4, _ := lookup(t, z, "ns", "a", "a.com"); v4 != "240.240.0.1" {
		t.Errorf("existing allocation moved to %s", v4)
	}
	if v4, _ := lookup(t, z, "aaa", "old", "old.com"); v4 != "240.240.0.5" {
		t.Errorf("new allocation = %s, want the next free 240.240.0.5", v4)
	}
}

func TestStableAcrossRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), DefaultFileName)
	ses := []*networkingv1.ServiceEntry{se("ns", "a", 1, dns, "a.com"), se("ns", "b", 2, dns, "b.com")}
	al, err := New(Config{Store: FileStore{Path: path}})
	if err != nil {
		t.Fatal(err)
	}
	first := mustAllocate(t, al, ses...)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("state not saved: %v", err)
	}
	// Restart: a was deleted meanwhile and a newer-but-sorted-first SE appears.
	al2, err := New(Config{Store: FileStore{Path: path}})
	if err != nil {
		t.Fatal(err)
	}
	second := mustAllocate(t, al2, se("aa", "new", 0, dns, "new.com"), ses[1])
	b1, _ := lookup(t, first, "ns", "b", "b.com")
	b2, _ := lookup(t, second, "ns", "b", "b.com")
	if b1 != b2 {
		t.Errorf("b.com moved across restart: %s → %s", b1, b2)
	}
	// The cursor is persisted: the new host does not reuse a's freed address.
	if v4, _ := lookup(t, second, "aa", "new", "new.com"); v4 != "240.240.0.3" {
		t.Errorf("new.com = %s, want 240.240.0.3 (freed addresses are not reused before wrap)", v4)
	}
}

func TestCorruptStateFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), DefaultFileName)
	os.WriteFile(path, []byte("{not json"), 0o644)
	if _, err := New(Config{Store: FileStore{Path: path}}); err == nil {
		t.Fatal("corrupt state file accepted")
	}
}

func TestOldestWinsConflict(t *testing.T) {
	// Both claim the same address in status (e.g. two controllers raced).
	young := se("ns", "young", 5, dns, "y.com")
	old := se("ns", "old", 1, dns, "o.com")
	for _, s := range []*networkingv1.ServiceEntry{young, old} {
		s.Status.Addresses = []*networkingv1alpha3.ServiceEntryAddress{
			{Value: "240.240.1.1", Host: s.Spec.Hosts[0]}, {Value: "2001:2::1:1", Host: s.Spec.Hosts[0]},
		}
	}
	al, _ := New(Config{})
	a := mustAllocate(t, al, young, old)
	if v4, v6 := lookup(t, a, "ns", "old", "o.com"); v4 != "240.240.1.1" || v6 != "2001:2::1:1" {
		t.Errorf("oldest lost its address: %s %s", v4, v6)
	}
	if v4, _ := lookup(t, a, "ns", "young", "y.com"); v4 == "240.240.1.1" {
		t.Error("younger kept the contested address")
	}
	// A user-specified address inside the range evicts auto holders.
	user := se("ns", "user", 9, dns, "u.com")
	user.Spec.Addresses = []string{"240.240.1.1"}
	b := mustAllocate(t, al, young, old, user)
	if v4, _ := lookup(t, b, "ns", "old", "o.com"); v4 == "240.240.1.1" {
		t.Error("auto allocation kept an address a user specified")
	}
}

func TestExhaustion(t *testing.T) {
	al, err := New(Config{V4Prefix: netip.MustParsePrefix("10.0.0.0/30"), V6Prefix: netip.MustParsePrefix("fd00::/126")})
	if err != nil {
		t.Fatal(err)
	}
	// /30 has 3 usable addresses after the network address.
	ses := []*networkingv1.ServiceEntry{
		se("ns", "a", 1, dns, "a.com"), se("ns", "b", 2, dns, "b.com"),
		se("ns", "c", 3, dns, "c.com"), se("ns", "d", 4, dns, "d.com"),
	}
	a, err := al.Allocate(ses)
	if !errors.Is(err, ErrExhausted) {
		t.Fatalf("err = %v, want ErrExhausted", err)
	}
	if len(a.List()) != 3 {
		t.Errorf("got %d allocations, want the 3 that fit", len(a.List()))
	}
	if a.Lookup("ns", "d", "d.com") != nil {
		t.Error("youngest should be the one left without addresses")
	}
	// Deleting one frees room: the wrap finds it.
	a, err = al.Allocate([]*networkingv1.ServiceEntry{ses[0], ses[2], ses[3]})
	if err != nil {
		t.Fatalf("after freeing: %v", err)
	}
	if v4, _ := lookup(t, a, "ns", "d", "d.com"); v4 != "10.0.0.2" {
		t.Errorf("d.com = %s, want the freed 10.0.0.2", v4)
	}
}

func TestLastAddr(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.0/30": "10.0.0.3", "240.240.0.0/16": "240.240.255.255", "2001:2::/48": "2001:2:0:ffff:ffff:ffff:ffff:ffff"} {
		if got := lastAddr(netip.MustParsePrefix(in)).String(); got != want {
			t.Errorf("lastAddr(%s) = %s, want %s", in, got, want)
		}
	}
}

// A large user CIDR inside the range is skipped in one step.
func TestReservedCIDRSkipped(t *testing.T) {
	user := se("ns", "user", 0, dns, "u.com")
	user.Spec.Addresses = []string{"2001:2::/49", "240.240.0.0/24"}
	al, _ := New(Config{})
	a := mustAllocate(t, al, user, se("ns", "a", 1, dns, "a.com"))
	if v4, v6 := lookup(t, a, "ns", "a", "a.com"); v4 != "240.240.1.0" || v6 != "2001:2:0:8000::" {
		t.Errorf("a.com = %s %s, want the first addresses after the reserved CIDRs", v4, v6)
	}
}

// flakyStore fails its first Save.
type flakyStore struct {
	st    State
	saves int
}

func (f *flakyStore) Load() (State, error) { return f.st, nil }
func (f *flakyStore) Save(st State) error {
	if f.saves++; f.saves == 1 {
		return errors.New("disk full")
	}
	f.st = st
	return nil
}

// TestSameInputSameResult: Allocate with the ServiceEntries of the last
// successful call returns that result as it is (no work, no new
// allocation); a call that failed to save is not remembered (the next one
// saves), and a changed ServiceEntry is allocated for again.
func TestSameInputSameResult(t *testing.T) {
	store := &flakyStore{}
	al, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	a, b := se("ns", "a", 1, dns, "a.example"), se("ns", "b", 2, dns, "b.example")
	first, err := al.Allocate([]*networkingv1.ServiceEntry{a, b})
	if err == nil {
		t.Fatal("first Save failed, but Allocate reported no error")
	}
	again := mustAllocate(t, al, a, b)
	if store.saves != 2 || store.st.Allocations == nil {
		t.Fatalf("after a failed Save, the same input saved %d times in all (state %v), want it saved again", store.saves, store.st)
	}
	if first.Lookup("ns", "a", "a.example")[0] != again.Lookup("ns", "a", "a.example")[0] {
		t.Errorf("the same input got other addresses after a failed Save")
	}
	if third := mustAllocate(t, al, a, b); third != again || store.saves != 2 {
		t.Errorf("the same input again: a new result (%v) or a Save (%d in all); want the last result as it is", third != again, store.saves)
	}
	c := se("ns", "c", 3, dns, "c.example")
	next := mustAllocate(t, al, a, b, c)
	if next == again || len(next.Lookup("ns", "c", "c.example")) != 2 {
		t.Fatalf("a new ServiceEntry got %v", next.Lookup("ns", "c", "c.example"))
	}
	if v4, _ := lookup(t, next, "ns", "a", "a.example"); v4 != again.Lookup("ns", "a", "a.example")[0].String() {
		t.Errorf("a's address moved to %s when c appeared", v4)
	}
}
