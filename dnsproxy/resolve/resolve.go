// Package resolve is the DNS proxy's pure answer decision: which mesh
// service, if any, answers a pod's A or AAAA query (search domains,
// wildcards, ExternalName aliases, address families). It reads only a state
// snapshot, so tools such as zctl use it without linking the DNS server.
package resolve

import (
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// DefaultClusterDomain is the Kubernetes cluster domain when none is
// configured.
const DefaultClusterDomain = "cluster.local"

// TTL is the time to live of every locally answered record, in seconds
// (ztunnel's value).
const TTL = 30

// maxAliasChain bounds how many ExternalName aliases one answer follows, so
// that an alias loop in the state ends (the query is then forwarded).
const maxAliasChain = 8

// Resolver decides the local answer to an A or AAAA query from a state
// snapshot (reference §6.2, §6.4). It is a pure function of its inputs and
// safe for concurrent use; the zero value uses the defaults noted.
type Resolver struct {
	// Domain is the cluster domain; "" means DefaultClusterDomain.
	Domain string
	// DisableIPv6 answers AAAA queries for mesh names with no records (as
	// "family not allowed"), never with an IPv6 address.
	DisableIPv6 bool
	// PreferredNamespace breaks ties between services of one hostname in
	// several namespaces after the client's own namespace and canonical
	// services (ztunnel's PREFERED_SERVICE_NAMESPACE); "" means none.
	PreferredNamespace string
}

// Answer is the decision for one query.
type Answer struct {
	// Found reports that the name is a mesh name: the server answers it
	// authoritatively (possibly with no records) instead of forwarding.
	Found bool
	// Service is the service whose addresses answer the query; for an
	// ExternalName alias, the service at the end of the alias chain.
	Service *state.Service
	// CNAMEs are the CNAME records placed before the address records, in
	// order: requested name → search-stripped name, then alias → target.
	CNAMEs []CNAME
	// Owner is the owner name of the address records (absolute, with the
	// trailing dot).
	Owner string
	// Addrs are Service's addresses of the queried family, in state order;
	// the server shuffles them. Empty means NOERROR with no records.
	Addrs []netip.Addr
	// FamilyNotAllowed reports that the service does not serve the queried
	// family (its ip_families, or IPv6 disabled); Addrs is empty then.
	FamilyNotAllowed bool
}

// CNAME is one CNAME record; both names are absolute (trailing dot).
type CNAME struct {
	Name, Target string
}

// match is a service found for one alias of the requested name.
type match struct {
	svc *state.Service
	// stripped is the name left after removing a search domain from the
	// requested name, "" when the alias did not come from stripping.
	stripped string
	// wildcard reports that the service matched through a wildcard host.
	wildcard bool
}

func (r *Resolver) domain() string {
	if r.Domain == "" {
		return DefaultClusterDomain
	}
	return r.Domain
}

// Resolve decides how to answer a query for qname (as it appears in the
// question, any case, absolute or not) of type qtype from client, the
// querying workload. Only A and AAAA are ever Found; every other type, an
// unknown name and a nil client give the zero Answer (forward).
func (r *Resolver) Resolve(snap *state.Snapshot, client *state.Workload, qname string, qtype uint16) Answer {
	if client == nil || (qtype != dns.TypeA && qtype != dns.TypeAAAA) {
		return Answer{}
	}
	name, ok := normalize(qname)
	if !ok {
		return Answer{}
	}
	m, ok := r.find(snap, client, name)
	if !ok {
		return Answer{}
	}
	ans := Answer{Found: true, Owner: dns.Fqdn(qname)}
	if m.stripped != "" && !m.wildcard {
		ans.CNAMEs = append(ans.CNAMEs, CNAME{Name: ans.Owner, Target: m.stripped + "."})
		ans.Owner = m.stripped + "."
	}
	svc := m.svc
	for n := 0; svc.AliasOf != ""; n++ {
		target, ok := normalize(svc.AliasOf)
		if !ok || n == maxAliasChain {
			return Answer{}
		}
		next, ok := r.lookupHost(snap, client, target)
		if !ok {
			// The alias points at a name this node does not know (yet):
			// let the cluster DNS answer the ExternalName CNAME.
			return Answer{}
		}
		ans.CNAMEs = append(ans.CNAMEs, CNAME{Name: ans.Owner, Target: target + "."})
		ans.Owner = target + "."
		svc = next.svc
	}
	ans.Service = svc
	if !r.familyAllowed(svc, qtype) {
		ans.FamilyNotAllowed = true
		return ans
	}
	ans.Addrs = r.addresses(snap, client, svc, qtype)
	return ans
}

// find tries the aliases of name in ztunnel's order (reference §6.2 step 1):
// the name itself, its Kubernetes expansions, then for each search domain
// of the client's namespace the name with that domain stripped and the
// expansions of the stripped name. The first alias with a service wins.
func (r *Resolver) find(snap *state.Snapshot, client *state.Workload, name string) (match, bool) {
	domain := r.domain()
	svcDomain := "svc." + domain
	nsDomain := client.Namespace + "." + svcDomain
	var tried [16]string // aliases already looked up; more are simply retried
	n := 0
	try := func(alias, stripped string) (match, bool) {
		for _, t := range tried[:n] {
			if t == alias {
				return match{}, false
			}
		}
		if n < len(tried) {
			tried[n] = alias
			n++
		}
		m, ok := r.lookupHost(snap, client, alias)
		m.stripped = stripped
		return m, ok
	}
	expandAndTry := func(base, stripped string) (match, bool) {
		if m, ok := try(base, stripped); ok {
			return m, true
		}
		for _, e := range kubeExpansions(base, domain, svcDomain, nsDomain) {
			if e == "" {
				continue
			}
			if m, ok := try(e, stripped); ok {
				return m, true
			}
		}
		return match{}, false
	}
	if m, ok := expandAndTry(name, ""); ok {
		return m, true
	}
	for _, sd := range [...]string{nsDomain, svcDomain, domain} {
		if stripped, ok := trimDomain(name, sd); ok {
			if m, ok := expandAndTry(stripped, stripped); ok {
				return m, true
			}
		}
	}
	return match{}, false
}

// kubeExpansions returns the Kubernetes FQDNs name may abbreviate, by label
// count: svc → svc.<ns>.svc.<domain>; svc.ns → svc.ns.svc.<domain> (and the
// pod-host form svc.ns.<ns>.svc.<domain>); svc.ns.svc → svc.ns.svc.<domain>
// and x.y.z → x.y.z.svc.<domain>; a.b.ns.svc → a.b.ns.svc.<domain>. Unused
// slots are "".
func kubeExpansions(name, domain, svcDomain, nsDomain string) [2]string {
	labels := strings.Count(name, ".") + 1
	endsSvc := strings.HasSuffix(name, ".svc")
	switch {
	case labels == 1:
		return [2]string{name + "." + nsDomain}
	case labels == 2:
		return [2]string{name + "." + svcDomain, name + "." + nsDomain}
	case labels == 3 && endsSvc:
		return [2]string{name + "." + domain, name + "." + svcDomain}
	case labels == 3:
		return [2]string{name + "." + svcDomain}
	case labels == 4 && endsSvc:
		return [2]string{name + "." + domain}
	}
	return [2]string{}
}

// trimDomain strips ".domain" from name; ok is false if name does not end in
// it (or is the domain itself).
func trimDomain(name, domain string) (string, bool) {
	if len(name) <= len(domain)+1 || !strings.HasSuffix(name, domain) || name[len(name)-len(domain)-1] != '.' {
		return "", false
	}
	return name[:len(name)-len(domain)-1], true
}

// lookupHost finds the service for one alias, trying the exact host then
// wildcards of decreasing specificity (www.a.com, *.a.com, *.com).
func (r *Resolver) lookupHost(snap *state.Snapshot, client *state.Workload, host string) (match, bool) {
	if svc := r.pick(snap.ServicesByHostname(host), client); svc != nil {
		return match{svc: svc}, true
	}
	for i := 0; i < len(host); i++ {
		if host[i] != '.' {
			continue
		}
		if svc := r.pick(snap.ServicesByHostname("*"+host[i:]), client); svc != nil {
			return match{svc: svc, wildcard: true}, true
		}
	}
	return match{}, false
}

// pick chooses among the services of one hostname (reference §6.2 step 3):
// services without a VIP are skipped unless they are Kubernetes services
// (headless, or ExternalName aliases), services not exported to the client's
// namespace are skipped; then the client's namespace wins, else a canonical
// service, else the preferred namespace, else the first (by key).
func (r *Resolver) pick(svcs []*state.Service, client *state.Workload) *state.Service {
	var first, canonical, preferred *state.Service
	for _, s := range svcs {
		if len(s.VIPs) == 0 && s.AliasOf == "" && !r.isKubernetes(s) {
			continue
		}
		if !s.VisibleTo(client.Namespace) {
			continue
		}
		if s.Namespace == client.Namespace {
			return s
		}
		if first == nil {
			first = s
		}
		if canonical == nil && s.Canonical {
			canonical = s
		}
		if preferred == nil && r.PreferredNamespace != "" && s.Namespace == r.PreferredNamespace {
			preferred = s
		}
	}
	switch {
	case canonical != nil:
		return canonical
	case preferred != nil:
		return preferred
	}
	return first
}

// isKubernetes reports whether s is a Kubernetes service by its hostname
// (<name>.<ns>.svc.<domain>), which is how a headless service is told apart
// from a ServiceEntry without addresses.
func (r *Resolver) isKubernetes(s *state.Service) bool {
	d := r.domain()
	h := s.Hostname
	return len(h) > len(d)+5 && strings.HasSuffix(h, d) && strings.HasSuffix(h[:len(h)-len(d)], ".svc.")
}

func (r *Resolver) familyAllowed(svc *state.Service, qtype uint16) bool {
	switch {
	case qtype == dns.TypeAAAA && r.DisableIPv6:
		return false
	case qtype == dns.TypeAAAA && svc.IPFamilies == state.IPFamiliesIPv4Only:
		return false
	case qtype == dns.TypeA && svc.IPFamilies == state.IPFamiliesIPv6Only:
		return false
	}
	return true
}

// addresses returns svc's addresses of the qtype family: its VIPs on the
// client's network, or for a headless service one address per healthy
// endpoint.
func (r *Resolver) addresses(snap *state.Snapshot, client *state.Workload, svc *state.Service, qtype uint16) []netip.Addr {
	want4 := qtype == dns.TypeA
	var out []netip.Addr
	if len(svc.VIPs) > 0 {
		for _, v := range svc.VIPs {
			a := v.Prefix.Addr()
			if v.Network == client.Network && v.Prefix.Bits() == a.BitLen() && a.Is4() == want4 {
				out = append(out, a)
			}
		}
		return out
	}
	for _, ep := range snap.Endpoints(svc) {
		if !ep.Workload.Healthy {
			continue
		}
		for _, a := range ep.Workload.Addresses {
			if a.Is4() == want4 {
				out = append(out, a)
				break
			}
		}
	}
	return out
}

// normalize lowercases name and removes the trailing dot. Names with escaped
// characters (never a hostname) and the root are rejected.
func normalize(name string) (string, bool) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || strings.IndexByte(name, '\\') >= 0 {
		return "", false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(name), true
		}
	}
	return name, true
}
