package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// Bounds of the HostResolver cache.
const (
	// minHostTTL and maxHostTTL clamp how long an answer is kept: a TTL of
	// 0 would resolve on every connection, a day-long one would pin an
	// address the provider moved.
	minHostTTL = time.Second
	maxHostTTL = 5 * time.Minute
	// maxHostEntries bounds the cache; expired entries go first.
	maxHostEntries = 4096
)

// ErrNoAddress is wrapped when a name resolves to no address of the asked
// families (NXDOMAIN, NODATA).
var ErrNoAddress = errors.New("dnsproxy: name has no address")

// HostResolver resolves the DNS names of workloads known by hostname only
// (ServiceEntry endpoints with resolution DNS) when the node proxy routes a
// connection to one, as Istio's ztunnel does on demand: A (and AAAA when
// IPv6 is on) queries to the Forwarder's upstreams, the ones the pods' DNS
// proxies forward to, from sockets in the calling pod's network namespace
// with the forwarder's mark. Answers are cached per name for their TTL
// (clamped to [1 s, 5 min]); failures are not cached. Safe for concurrent
// use; share one per process.
type HostResolver struct {
	fwd  *Forwarder
	ipv6 bool
	now  func() time.Time

	mu    sync.Mutex
	cache map[string]hostEntry
}

type hostEntry struct {
	addrs   []netip.Addr // shared, read-only
	expires time.Time
}

// NewHostResolver resolves through fwd's upstreams (required); ipv6 also
// asks for AAAA records.
func NewHostResolver(fwd *Forwarder, ipv6 bool) (*HostResolver, error) {
	if fwd == nil {
		return nil, errors.New("dnsproxy: HostResolver needs a Forwarder")
	}
	return &HostResolver{fwd: fwd, ipv6: ipv6, now: time.Now, cache: make(map[string]hostEntry)}, nil
}

// LookupHost returns the addresses of host (IPv4 first), resolving from
// inside ns (nil: the current namespace) unless a fresh answer is cached.
// The slice is shared: do not modify it.
func (r *HostResolver) LookupHost(ctx context.Context, ns *netns.Handle, host string) ([]netip.Addr, error) {
	name := dns.CanonicalName(host)
	now := r.now()
	r.mu.Lock()
	e, ok := r.cache[name]
	r.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.addrs, nil
	}
	up := newUpstreams(ns, r.fwd.opts)
	defer up.close()
	types := []uint16{dns.TypeA}
	if r.ipv6 {
		types = append(types, dns.TypeAAAA)
	}
	var (
		addrs []netip.Addr
		ttl   = maxHostTTL
		errs  []error
	)
	for _, qt := range types {
		got, t, err := r.query(ctx, up, name, qt)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		addrs = append(addrs, got...)
		ttl = min(ttl, t)
	}
	if len(addrs) == 0 {
		if len(errs) == 0 {
			return nil, fmt.Errorf("%w: %s", ErrNoAddress, strings.TrimSuffix(name, "."))
		}
		return nil, fmt.Errorf("dnsproxy: resolve %s: %w", strings.TrimSuffix(name, "."), errors.Join(errs...))
	}
	r.store(name, hostEntry{addrs: addrs, expires: now.Add(max(ttl, minHostTTL))}, now)
	return addrs, nil
}

// query asks the upstreams for name's records of type qt and returns the
// addresses with the smallest TTL among them (CNAME chains as the upstream
// recursor answers them are followed by taking every record of the type).
func (r *HostResolver) query(ctx context.Context, up *upstreams, name string, qt uint16) ([]netip.Addr, time.Duration, error) {
	q := new(dns.Msg)
	q.SetQuestion(name, qt)
	q.RecursionDesired = true
	raw, err := q.Pack()
	if err != nil {
		return nil, 0, fmt.Errorf("dnsproxy: query %s: %w", name, err)
	}
	bp := r.fwd.getBuf()
	defer r.fwd.putBuf(bp)
	n, err := r.fwd.exchange(ctx, up, raw, *bp)
	if err != nil {
		return nil, 0, err
	}
	var resp dns.Msg
	if err := resp.Unpack((*bp)[:n]); err != nil {
		return nil, 0, fmt.Errorf("dnsproxy: answer for %s: %w", name, err)
	}
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return nil, 0, fmt.Errorf("%w: %s: NXDOMAIN", ErrNoAddress, name)
	default:
		return nil, 0, fmt.Errorf("dnsproxy: %s %s: upstream answered %s", name, dns.TypeToString[qt], dns.RcodeToString[resp.Rcode])
	}
	var out []netip.Addr
	ttl := maxHostTTL
	for _, rr := range resp.Answer {
		var ip netip.Addr
		switch v := rr.(type) {
		case *dns.A:
			ip, _ = netip.AddrFromSlice(v.A.To4())
		case *dns.AAAA:
			ip, _ = netip.AddrFromSlice(v.AAAA.To16())
		default:
			continue
		}
		if !ip.IsValid() || rr.Header().Rrtype != qt {
			continue
		}
		out = append(out, ip.Unmap())
		ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
	}
	return out, ttl, nil
}

func (r *HostResolver) store(name string, e hostEntry, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= maxHostEntries {
		for k, old := range r.cache {
			if !now.Before(old.expires) {
				delete(r.cache, k)
			}
		}
		for k := range r.cache {
			if len(r.cache) < maxHostEntries {
				break
			}
			delete(r.cache, k)
		}
	}
	r.cache[name] = e
}
