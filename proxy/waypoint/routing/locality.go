package routing

import (
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// Locality load balancing (DestinationRule localityLbSetting), as Istio
// configures Envoy from the proxy's own locality, here the waypoint's
// workload in the workload API:
//
//   - distribute: the first entry whose from matches the waypoint's
//     locality weighs the endpoints' localities by its to (a pattern's
//     weight shared by the endpoints it matches, Istio's
//     applyLocalityWeights); localities it does not name get nothing;
//   - failover (the control plane sends it only with outlier detection):
//     priorities, 0 for the waypoint's region, zone and subzone, 1 its
//     region and zone, 2 its region, 3 a region its failover names, 4 the
//     rest (Istio's applyLocalityFailover); with failoverPriority, by how
//     many of those labels, in order, match the waypoint's;
//   - traffic goes to priorities as Envoy's priority load: a priority
//     takes min(100, 1.4 × its healthy share) percent of what is left
//     (the overprovisioning factor), so a level whose endpoints are ejected
//     sheds its traffic to the next.
type localityPolicy struct {
	distribute []*waypointapi.LocalityDistribute
	failover   []*waypointapi.LocalityFailover
	labels     []string
}

func compileLocality(l *waypointapi.LocalityLb) *localityPolicy {
	if l == nil {
		return nil
	}
	return &localityPolicy{distribute: l.GetDistribute(), failover: l.GetFailover(), labels: l.GetFailoverPriority()}
}

// localityMatch is Istio's util.LocalityMatch: pattern "region/zone/subzone"
// where "*" or a missing part matches anything.
func localityMatch(l state.Locality, pattern string) bool {
	parts := strings.Split(pattern, "/")
	have := []string{l.Region, l.Zone, l.Subzone}
	for i, p := range parts {
		if i >= 3 {
			return false
		}
		if p != "*" && p != have[i] {
			return false
		}
	}
	return true
}

// overprovision is Envoy's default overprovisioning factor (1.4).
const overprovision = 140

// narrow returns the endpoints of cands (ejected ones listed too) that a
// request goes to, its locality or priority chosen with key's hash when it
// has one (the same key stays in one locality), else at random.
func (lp *localityPolicy) narrow(self *state.Workload, cands []candidate, key hashKey, rnd func(uint64) uint64) []candidate {
	var me state.Locality
	network := ""
	if self != nil {
		me, network = self.Locality, self.Network
	}
	pick := func(n uint64) uint64 {
		if key.ok {
			return (key.h >> 7) % n
		}
		return rnd(n)
	}
	for _, d := range lp.distribute {
		if !localityMatch(me, d.GetFrom()) {
			continue
		}
		// weight of each endpoint: its pattern's weight shared by the
		// endpoints that pattern matches first.
		w := make([]uint64, len(cands))
		taken := make([]bool, len(cands))
		for pat, weight := range d.GetTo() {
			var idx []int
			for i := range cands {
				if !taken[i] && localityMatch(cands[i].w.Locality, pat) {
					idx = append(idx, i)
				}
			}
			for _, i := range idx {
				taken[i] = true
				w[i] = uint64(weight) * 1000 / uint64(len(idx))
			}
		}
		var total uint64
		for i := range cands {
			if cands[i].ejected {
				w[i] = 0
			}
			total += w[i]
		}
		if total == 0 {
			return healthyOf(cands)
		}
		r := pick(total)
		var chosen state.Locality
		for i := range cands {
			if r < w[i] {
				chosen = cands[i].w.Locality
				break
			}
			r -= w[i]
		}
		out := cands[:0:0]
		for i := range cands {
			if w[i] > 0 && cands[i].w.Locality == chosen {
				out = append(out, cands[i])
			}
		}
		return out
	}
	if len(lp.distribute) > 0 {
		return healthyOf(cands)
	}
	// Failover priorities. The common case, one priority and nothing
	// ejected, allocates nothing.
	if lp.onePriority(me, network, cands) {
		return cands
	}
	prio := make([]int, len(cands))
	levels := 0
	for i := range cands {
		prio[i] = lp.priority(me, network, cands[i].w)
		levels = max(levels, prio[i]+1)
	}
	total, healthy := make([]int, levels), make([]int, levels)
	for i := range cands {
		total[prio[i]]++
		if !cands[i].ejected {
			healthy[prio[i]]++
		}
	}
	// Envoy's priority load: each level takes min(left, 1.4 × health).
	load := make([]int, levels)
	left, sum := 100, 0
	for l := range levels {
		if total[l] == 0 {
			continue
		}
		h := min(100, overprovision*healthy[l]/total[l])
		load[l] = min(left, h)
		left -= load[l]
		sum += load[l]
	}
	if sum == 0 {
		return healthyOf(cands)
	}
	r := int(pick(uint64(sum)))
	chosen := 0
	for l := range levels {
		if r < load[l] {
			chosen = l
			break
		}
		r -= load[l]
	}
	out := cands[:0:0]
	for i := range cands {
		if prio[i] == chosen && !cands[i].ejected {
			out = append(out, cands[i])
		}
	}
	return out
}

// onePriority reports whether every candidate has the first one's
// priority and none is ejected.
func (lp *localityPolicy) onePriority(me state.Locality, network string, cands []candidate) bool {
	if len(cands) == 0 {
		return false
	}
	p0 := lp.priority(me, network, cands[0].w)
	for i := range cands {
		if cands[i].ejected || lp.priority(me, network, cands[i].w) != p0 {
			return false
		}
	}
	return true
}

func healthyOf(cands []candidate) []candidate {
	out := cands[:0:0]
	for i := range cands {
		if !cands[i].ejected {
			out = append(out, cands[i])
		}
	}
	return out
}

// priority is endpoint w's failover priority for a waypoint at me.
func (lp *localityPolicy) priority(me state.Locality, network string, w *state.Workload) int {
	if len(lp.labels) > 0 {
		n := 0
	labels:
		for _, l := range lp.labels {
			var a, b string
			switch l {
			case "topology.istio.io/network":
				a, b = network, w.Network
			case "topology.kubernetes.io/region":
				a, b = me.Region, w.Locality.Region
			case "topology.kubernetes.io/zone":
				a, b = me.Zone, w.Locality.Zone
			case "topology.istio.io/subzone":
				a, b = me.Subzone, w.Locality.Subzone
			}
			if a != b {
				break labels
			}
			n++
		}
		return len(lp.labels) - n
	}
	l := w.Locality
	switch {
	case l.Region == me.Region && l.Zone == me.Zone && l.Subzone == me.Subzone:
		return 0
	case l.Region == me.Region && l.Zone == me.Zone:
		return 1
	case l.Region == me.Region:
		return 2
	}
	for _, f := range lp.failover {
		if f.GetFrom() == me.Region && f.GetTo() == l.Region {
			return 3
		}
	}
	return 4
}
