// Package autoalloc assigns virtual IPs to ServiceEntry hosts that have none,
// as istiod's IP auto-allocation controller does: one IPv4 address from
// 240.240.0.0/16 and one IPv6 address from 2001:2::/48 per eligible host.
//
// Allocations are stable: a host keeps the addresses it already has (from the
// ServiceEntry's status.addresses, or else from the persisted state), across
// restarts and whatever the order of the input. When two hosts claim the same
// address the oldest ServiceEntry (creationTimestamp, then namespace/name)
// keeps it and the other gets a new one. New addresses are handed out
// sequentially from a cursor that is persisted too, so a freed address is not
// reused until the range wraps.
//
// Persistence is pluggable (Store): local mode keeps a JSON file in the state
// directory (FileStore); Kubernetes mode's store is
// internal/controlplane/kubestatus, which writes status.addresses while it
// holds the leader Lease. With several replicas only the leader hands out
// addresses: a Store that implements Gate (kubestatus does) makes every
// other replica serve exactly what status.addresses says, never an address
// of its own. The package does not translate ServiceEntries into mesh
// resources; internal/controlplane/translate reads the Allocations.
package autoalloc

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// Default ranges (istiod's PILOT_IP_AUTOALLOCATE_IPV4_PREFIX / _IPV6_PREFIX).
var (
	DefaultV4Prefix = netip.MustParsePrefix("240.240.0.0/16")
	DefaultV6Prefix = netip.MustParsePrefix("2001:2::/48")
)

// LabelEnableAutoallocate set to "false" on a ServiceEntry opts it out.
const LabelEnableAutoallocate = "networking.istio.io/enable-autoallocate-ip"

// ErrExhausted is returned (wrapped) when a range has no free address left.
var ErrExhausted = errors.New("autoalloc: address range exhausted")

// Allocation is the pair of addresses given to one host of one ServiceEntry.
type Allocation struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Host      string     `json:"host"`
	V4        netip.Addr `json:"v4,omitzero"`
	V6        netip.Addr `json:"v6,omitzero"`
}

// Key is "namespace/name/host".
func (a Allocation) Key() string { return key(a.Namespace, a.Name, a.Host) }

func key(ns, name, host string) string { return ns + "/" + name + "/" + host }

// Allocations is an immutable result of Allocate.
type Allocations struct {
	list  []Allocation
	byKey map[string]Allocation
}

// Lookup returns the addresses of host in ServiceEntry ns/name (IPv4 first),
// or nil. A nil *Allocations has no allocations.
func (a *Allocations) Lookup(ns, name, host string) []netip.Addr {
	if a == nil {
		return nil
	}
	al, ok := a.byKey[key(ns, name, host)]
	if !ok {
		return nil
	}
	var out []netip.Addr
	if al.V4.IsValid() {
		out = append(out, al.V4)
	}
	if al.V6.IsValid() {
		out = append(out, al.V6)
	}
	return out
}

// ListEqual reports whether List would equal list, without copying it.
func (a *Allocations) ListEqual(list []Allocation) bool {
	if a == nil {
		return len(list) == 0
	}
	return slices.Equal(a.list, list)
}

// List returns every allocation sorted by key.
func (a *Allocations) List() []Allocation {
	if a == nil {
		return nil
	}
	return append([]Allocation(nil), a.list...)
}

func newAllocations(m map[string]Allocation) *Allocations {
	out := &Allocations{byKey: m}
	for _, v := range m {
		out.list = append(out.list, v)
	}
	sort.Slice(out.list, func(i, j int) bool { return out.list[i].Key() < out.list[j].Key() })
	return out
}

// Config configures an Allocator. The zero value allocates from the default
// ranges and keeps its state in memory only.
type Config struct {
	// V4Prefix and V6Prefix are the ranges; the zero prefix means the default.
	V4Prefix, V6Prefix netip.Prefix
	// Store persists the state; nil means in memory only (addresses then
	// survive re-translation but not a restart).
	Store Store
}

// Allocator keeps the allocation state. It is safe for concurrent use.
type Allocator struct {
	v4, v6 netip.Prefix
	store  Store

	mu    sync.Mutex
	state State
	dirty bool // state differs from what the store holds
	// last is the latest Allocate that succeeded, for the next one with
	// the same input (most control-plane changes touch no ServiceEntry).
	last *allocateMemo
}

// allocateMemo is one successful Allocate: the ServiceEntries (immutable
// objects, compared by pointer), the gate's answer, and the result. The
// state after it is what the same input computes again (it keeps every
// address it holds and needs no new one), so the same input gives the
// same result until the state changes, which only Allocate does.
type allocateMemo struct {
	ses         []*networkingv1.ServiceEntry
	mayAllocate bool
	res         *Allocations
}

// New creates an allocator and loads the store's state. A state file that
// cannot be parsed is an error (deleting it loses stability but is safe).
func New(cfg Config) (*Allocator, error) {
	a := &Allocator{v4: cfg.V4Prefix, v6: cfg.V6Prefix, store: cfg.Store}
	if !a.v4.IsValid() {
		a.v4 = DefaultV4Prefix
	}
	if !a.v6.IsValid() {
		a.v6 = DefaultV6Prefix
	}
	if !a.v4.Addr().Is4() || !a.v6.Addr().Is6() {
		return nil, fmt.Errorf("autoalloc: ranges %s and %s must be IPv4 and IPv6", a.v4, a.v6)
	}
	a.v4, a.v6 = a.v4.Masked(), a.v6.Masked()
	if a.store != nil {
		st, err := a.store.Load()
		if err != nil {
			return nil, err
		}
		a.state = st
	}
	return a, nil
}

// Gate is implemented by a Store that decides whether this replica may
// hand out addresses (Kubernetes: only the holder of the Lease that writes
// status.addresses). A replica that may not serves each host's
// status.addresses and nothing else: no persisted state, no new address,
// so every replica serves the same addresses. Hosts without status wait
// for the leader to write it.
type Gate interface {
	// MayAllocate reports whether this replica allocates now.
	MayAllocate() bool
	// GateChanged is signalled (not closed) when MayAllocate may have
	// changed, so the caller allocates again (a new leader allocates what
	// its predecessor left without status).
	GateChanged() <-chan struct{}
}

// Changed is the store's GateChanged channel, or nil (never ready) when
// the store is not a Gate: the control plane re-allocates when it fires.
func (a *Allocator) Changed() <-chan struct{} {
	if g, ok := a.store.(Gate); ok {
		return g.GateChanged()
	}
	return nil
}

// Eligible reports whether host of se gets auto-allocated addresses:
// resolution is not NONE, spec.addresses is empty, the SE is not labelled
// networking.istio.io/enable-autoallocate-ip=false, and a wildcard host only
// with resolution DYNAMIC_DNS.
func Eligible(se *networkingv1.ServiceEntry, host string) bool {
	if se.Spec.Resolution == networkingv1alpha3.ServiceEntry_NONE || len(se.Spec.Addresses) > 0 {
		return false
	}
	if strings.EqualFold(se.Labels[LabelEnableAutoallocate], "false") {
		return false
	}
	if strings.HasPrefix(host, "*") && se.Spec.Resolution != networkingv1alpha3.ServiceEntry_DYNAMIC_DNS {
		return false
	}
	return host != ""
}

type pair struct {
	se   *networkingv1.ServiceEntry
	host string
	key  string
}

// Allocate computes the allocations for the given ServiceEntries (the full
// current set), persists the state if it changed, and returns the result.
// On ErrExhausted the returned Allocations still hold every host that got
// addresses; a store failure is returned with the (valid, in-memory) result.
func (a *Allocator) Allocate(ses []*networkingv1.ServiceEntry) (*Allocations, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mayAllocate := true
	if g, ok := a.store.(Gate); ok {
		mayAllocate = g.MayAllocate()
	}

	if m := a.last; m != nil && m.mayAllocate == mayAllocate && slices.Equal(m.ses, ses) {
		return m.res, nil
	}
	a.last = nil

	sorted := append([]*networkingv1.ServiceEntry(nil), ses...)
	sort.SliceStable(sorted, func(i, j int) bool { return olderThan(sorted[i], sorted[j]) })

	var pairs []pair
	var reserved []netip.Prefix // user-specified addresses inside our ranges
	for _, se := range sorted {
		for _, s := range se.Spec.Addresses {
			if p, ok := parsePrefix(s); ok && (p.Overlaps(a.v4) || p.Overlaps(a.v6)) {
				reserved = append(reserved, p)
			}
		}
		seen := map[string]bool{}
		for _, h := range se.Spec.Hosts {
			if seen[h] || !Eligible(se, h) {
				continue
			}
			seen[h] = true
			pairs = append(pairs, pair{se: se, host: h, key: key(se.Namespace, se.Name, h)})
		}
	}

	prev := map[string]Allocation{}
	if mayAllocate { // a follower never serves addresses of its own
		for _, al := range a.state.Allocations {
			prev[al.Key()] = al
		}
	}
	out := map[string]Allocation{}
	taken := map[netip.Addr]bool{}
	usable := func(c netip.Addr, rng netip.Prefix) bool {
		if !c.IsValid() || !rng.Contains(c) || c == rng.Addr() || taken[c] {
			return false
		}
		for _, r := range reserved {
			if r.Contains(c) {
				return false
			}
		}
		return true
	}
	// Pass 1, oldest first: keep existing addresses (status, then state).
	for _, p := range pairs {
		al := Allocation{Namespace: p.se.Namespace, Name: p.se.Name, Host: p.host}
		st4, st6 := statusAddrs(p.se, p.host)
		for _, c := range []netip.Addr{st4, prev[p.key].V4} {
			if usable(c, a.v4) {
				al.V4, taken[c] = c, true
				break
			}
		}
		for _, c := range []netip.Addr{st6, prev[p.key].V6} {
			if usable(c, a.v6) {
				al.V6, taken[c] = c, true
				break
			}
		}
		out[p.key] = al
	}
	// Pass 2, oldest first: hand out new addresses (a follower leaves the
	// hosts without status to the leader).
	var exhausted []string
	next4, next6 := a.state.Next4, a.state.Next6
	for _, p := range pairs {
		if !mayAllocate {
			if al := out[p.key]; !al.V4.IsValid() && !al.V6.IsValid() {
				delete(out, p.key)
			}
			continue
		}
		al := out[p.key]
		if !al.V4.IsValid() {
			if c, ok := nextFree(a.v4, &next4, reserved, usable); ok {
				al.V4, taken[c] = c, true
			} else {
				exhausted = append(exhausted, p.key+" (IPv4)")
			}
		}
		if !al.V6.IsValid() {
			if c, ok := nextFree(a.v6, &next6, reserved, usable); ok {
				al.V6, taken[c] = c, true
			} else {
				exhausted = append(exhausted, p.key+" (IPv6)")
			}
		}
		if !al.V4.IsValid() && !al.V6.IsValid() {
			delete(out, p.key)
			continue
		}
		out[p.key] = al
	}

	res := newAllocations(out)
	ns := State{Version: stateVersion, Next4: next4, Next6: next6, Allocations: res.List()}
	if !ns.equal(a.state) {
		a.state, a.dirty = ns, true
	}
	var errs []error
	if len(exhausted) > 0 {
		errs = append(errs, fmt.Errorf("%w: no address for %s", ErrExhausted, strings.Join(exhausted, ", ")))
	}
	if a.dirty && a.store != nil {
		if err := a.store.Save(a.state); err != nil {
			errs = append(errs, err)
		} else {
			a.dirty = false
		}
	}
	if len(errs) == 0 { // a failed Save or exhaustion is tried again
		a.last = &allocateMemo{ses: slices.Clone(ses), mayAllocate: mayAllocate, res: res}
	}
	return res, errors.Join(errs...)
}

// nextFree returns the first usable address at or after *cursor, wrapping
// once to the start of rng, and advances *cursor past it. Reserved prefixes
// are skipped whole, so a large user CIDR inside the range costs one step.
func nextFree(rng netip.Prefix, cursor *netip.Addr, reserved []netip.Prefix, usable func(netip.Addr, netip.Prefix) bool) (netip.Addr, bool) {
	first := rng.Addr().Next()
	start := *cursor
	if !rng.Contains(start) || start == rng.Addr() {
		start = first
	}
	c := start
	wrapped := false
	for {
		if usable(c, rng) {
			*cursor = c.Next()
			return c, true
		}
		next := c.Next()
		for _, r := range reserved {
			if r.Contains(c) {
				next = lastAddr(r).Next()
				break
			}
		}
		c = next
		if !c.IsValid() || !rng.Contains(c) {
			if wrapped {
				return netip.Addr{}, false
			}
			wrapped, c = true, first
		}
		if wrapped && !c.Less(start) {
			return netip.Addr{}, false
		}
	}
}

// lastAddr returns the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func statusAddrs(se *networkingv1.ServiceEntry, host string) (v4, v6 netip.Addr) {
	for _, sa := range se.Status.GetAddresses() {
		if sa.GetHost() != host {
			continue
		}
		ip, err := netip.ParseAddr(sa.GetValue())
		if err != nil {
			continue
		}
		switch {
		case ip.Is4() && !v4.IsValid():
			v4 = ip
		case ip.Is6() && !v6.IsValid():
			v6 = ip
		}
	}
	return v4, v6
}

func parsePrefix(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(ip, ip.BitLen()), true
	}
	return netip.Prefix{}, false
}

func olderThan(a, b *networkingv1.ServiceEntry) bool {
	ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time
	if !ta.Equal(tb) {
		return ta.Before(tb)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}
