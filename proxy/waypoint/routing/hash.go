package routing

import (
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// Consistent hashing (DestinationRule loadBalancer.consistentHash), as
// Envoy's ring hash and Maglev load balancers: a request's hash key (a
// header, a cookie, the source IP or a query parameter) is hashed with
// xxHash64, as Envoy does, and looked up in a table built over the pool's
// endpoints that are not ejected. Both tables move only about 1/n of the
// keys when an endpoint comes or goes; every waypoint replica builds the
// same table from the same endpoints (the hash has no per-process seed). A
// request without its key is balanced by loadBalancer.simple's default,
// as Envoy picks at random then.
type hashPolicy struct {
	key    waypointapi.ConsistentHash_Key
	name   string
	maglev bool
	size   int
	// cookie: the cookie set when it is absent (ttl given); path and
	// max-age for its Set-Cookie.
	genCookie bool
	path      string
	ttl       time.Duration
}

func compileHash(h *waypointapi.ConsistentHash) *hashPolicy {
	if h == nil {
		return nil
	}
	name := h.GetName()
	if h.GetKey() == waypointapi.ConsistentHash_HEADER {
		name = http.CanonicalHeaderKey(name)
	}
	hp := &hashPolicy{key: h.GetKey(), name: name, maglev: h.GetMaglev(), size: int(min(max(h.GetTableSize(), 1), 8<<20)),
		genCookie: h.GetCookieTtlSet(), path: h.GetCookiePath(), ttl: time.Duration(h.GetCookieTtlMs()) * time.Millisecond}
	if hp.maglev && !prime(hp.size) {
		hp.size = 65537 // Envoy's default; the control plane refuses others
	}
	return hp
}

func prime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// hashKey is a request's hash; ok false: it has no key.
type hashKey struct {
	h  uint64
	ok bool
}

// key computes r's hash key from src (the client's address), and the
// Set-Cookie value to answer with when it generated the cookie ("": none).
func (hp *hashPolicy) keyOf(r *http.Request, src, dst netip.AddrPort) (hashKey, string) {
	switch hp.key {
	case waypointapi.ConsistentHash_SOURCE_IP:
		if src.IsValid() {
			return hashKey{h: xxhash.Sum64String(src.Addr().String()), ok: true}, ""
		}
	case waypointapi.ConsistentHash_HEADER:
		if r == nil {
			break
		}
		if vs := r.Header[hp.name]; len(vs) == 1 {
			return hashKey{h: xxhash.Sum64String(vs[0]), ok: true}, ""
		} else if len(vs) > 1 {
			// Envoy hashes every value of a repeated header, sorted.
			s := slices.Clone(vs)
			slices.Sort(s)
			return hashKey{h: xxhash.Sum64String(strings.Join(s, ",")), ok: true}, ""
		}
	case waypointapi.ConsistentHash_QUERY_PARAMETER:
		if r == nil || r.URL.RawQuery == "" {
			break
		}
		if q := r.URL.Query(); q.Has(hp.name) {
			return hashKey{h: xxhash.Sum64String(q.Get(hp.name)), ok: true}, ""
		}
	case waypointapi.ConsistentHash_COOKIE:
		if r == nil {
			break
		}
		if c, err := r.Cookie(hp.name); err == nil {
			return hashKey{h: xxhash.Sum64String(c.Value), ok: true}, ""
		}
		if hp.genCookie {
			// Envoy's generated value: the hex xxHash64 of the client's
			// and the listener's addresses, hashed again as the key.
			v := strconv.FormatUint(xxhash.Sum64String(src.String()+dst.String()), 16)
			set := hp.name + `="` + v + `"`
			if hp.ttl > 0 {
				set += "; Max-Age=" + strconv.FormatInt(int64(hp.ttl/time.Second), 10)
			}
			if hp.path != "" {
				set += "; Path=" + hp.path
			}
			return hashKey{h: xxhash.Sum64String(v), ok: true}, set + "; HttpOnly"
		}
	}
	return hashKey{}, ""
}

// hashTable is a built ring or Maglev table over one endpoint set.
type hashTable struct {
	fp   uint64 // which endpoint set and table it is (fingerprint)
	uids []string
	ring []ringEntry // ring hash: sorted by hash
	mag  []int32     // Maglev: index into uids
}

type ringEntry struct {
	h   uint64
	idx int32
}

// fingerprint identifies the candidates (order-independent) and the table
// kind and size.
func fingerprint(hp *hashPolicy, cands []candidate) uint64 {
	fp := uint64(len(cands))*0x9e3779b97f4a7c15 ^ uint64(hp.size)
	if hp.maglev {
		fp = ^fp
	}
	for i := range cands {
		fp += xxhash.Sum64String(cands[i].w.UID) | 1
	}
	return fp
}

// byHash picks the candidate for hash h from the pool's table, building
// it when the endpoint set changed.
func (p *pool) byHash(hp *hashPolicy, cands []candidate, h uint64) candidate {
	if len(cands) == 1 {
		return cands[0]
	}
	fp := fingerprint(hp, cands)
	t := p.table.Load()
	if t == nil || t.fp != fp {
		t = buildTable(hp, cands, fp)
		p.table.Store(t)
	}
	uid := t.lookup(h)
	for i := range cands {
		if cands[i].w.UID == uid {
			return cands[i]
		}
	}
	return cands[0] // not reached: the table holds exactly the candidates
}

func buildTable(hp *hashPolicy, cands []candidate, fp uint64) *hashTable {
	t := &hashTable{fp: fp, uids: make([]string, len(cands))}
	for i := range cands {
		t.uids[i] = cands[i].w.UID
	}
	slices.Sort(t.uids) // the same table whatever the endpoints' order
	n := len(t.uids)
	if hp.maglev {
		t.mag = maglevTable(t.uids, hp.size)
		return t
	}
	// Envoy's ring: each endpoint hashed at ceil(size/n) points,
	// "<name>_<i>".
	per := (hp.size + n - 1) / n
	t.ring = make([]ringEntry, 0, per*n)
	buf := make([]byte, 0, 128)
	for idx, uid := range t.uids {
		for i := 0; i < per; i++ {
			buf = strconv.AppendInt(append(append(buf[:0], uid...), '_'), int64(i), 10)
			t.ring = append(t.ring, ringEntry{h: xxhash.Sum64(buf), idx: int32(idx)})
		}
	}
	slices.SortFunc(t.ring, func(a, b ringEntry) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return int(a.idx - b.idx)
	})
	return t
}

// maglevTable fills a table of size m (a prime) as Maglev does: each
// endpoint walks its own permutation (offset, skip from two hashes of its
// name) and takes the next free entry, in turns.
func maglevTable(uids []string, m int) []int32 {
	table := make([]int32, m)
	for i := range table {
		table[i] = -1
	}
	n := len(uids)
	offset, skip, next := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i, uid := range uids {
		offset[i] = xxhash.Sum64String(uid) % uint64(m)
		skip[i] = xxhash.Sum64String(uid+"#skip")%uint64(max(m-1, 1)) + 1
	}
	filled := 0
	for filled < m {
		for i := 0; i < n && filled < m; i++ {
			c := (offset[i] + next[i]*skip[i]) % uint64(m)
			for table[c] >= 0 {
				next[i]++
				c = (offset[i] + next[i]*skip[i]) % uint64(m)
			}
			table[c] = int32(i)
			next[i]++
			filled++
		}
	}
	return table
}

func (t *hashTable) lookup(h uint64) string {
	if t.mag != nil {
		return t.uids[t.mag[h%uint64(len(t.mag))]]
	}
	i, _ := slices.BinarySearchFunc(t.ring, h, func(e ringEntry, h uint64) int {
		switch {
		case e.h < h:
			return -1
		case e.h > h:
			return 1
		}
		return 0
	})
	if i == len(t.ring) {
		i = 0
	}
	return t.uids[t.ring[i].idx]
}
