package state

import (
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/statetest"
)

// snapshotContents is every index of a snapshot as plain values, for
// reflect.DeepEqual (pointers are compared by what they point at, lists in
// order).
type snapshotContents struct {
	Workloads  map[string]*Workload
	WorkloadIP map[netAddr]*Workload
	ByNode     map[string][]*Workload
	Endpoints  map[string][]Endpoint
	Services   map[string]*Service
	ServiceVIP map[netAddr][]*Service
	ServiceHst map[string][]*Service
	ServicePfx []prefixVIP
	Lens       [7]int
}

func contentsOf(s *Snapshot) snapshotContents {
	c := snapshotContents{
		Workloads: map[string]*Workload{}, WorkloadIP: map[netAddr]*Workload{}, ByNode: map[string][]*Workload{},
		Endpoints: map[string][]Endpoint{}, Services: map[string]*Service{}, ServiceVIP: map[netAddr][]*Service{},
		ServiceHst: map[string][]*Service{}, ServicePfx: s.servicePfx.vips(),
		Lens: [7]int{s.workloads.len(), s.workloadIP.len(), s.byNode.len(), s.endpoints.len(), s.services.len(), s.serviceVIP.len(), s.serviceHst.len()},
	}
	for k, v := range s.workloads.all() {
		c.Workloads[k] = v
	}
	for k, v := range s.workloadIP.all() {
		c.WorkloadIP[k] = v
	}
	for k, v := range s.byNode.all() {
		c.ByNode[k] = v
	}
	for k, v := range s.endpoints.all() {
		c.Endpoints[k] = v
	}
	for k, v := range s.services.all() {
		c.Services[k] = v
	}
	for k, v := range s.serviceVIP.all() {
		c.ServiceVIP[k] = v
	}
	for k, v := range s.serviceHst.all() {
		c.ServiceHst[k] = v
	}
	return c
}

// buildBoth converts as (in this order, twice, so the two builds share no
// objects) and indexes them onto old after removing removes: serially as
// ApplyAddresses does for small updates, and with indexParallel.
func buildBoth(t *testing.T, old *Snapshot, as []*workloadapi.Address, removes []string) (serial, parallel *Snapshot, serialErrs, parallelErrs []*ResourceError) {
	t.Helper()
	convert := func() []converted {
		in := interner{validateOnly: true}
		out := make([]converted, len(as))
		for i, a := range as {
			out[i].name = name(a)
			if i%97 == 13 {
				out[i].name += "-mismatch" // a rejected resource
			}
			convertAddress(&in, a, &out[i])
		}
		return out
	}
	remove := func(b *builder) {
		for _, n := range removes {
			if _, ok := b.workloads.get(n); ok {
				b.removeWorkload(n)
			} else {
				b.removeService(n)
			}
		}
	}

	ss := &Store{}
	b := newBuilder(old)
	remove(b)
	for _, c := range convert() {
		switch {
		case c.err != nil:
			serialErrs = append(serialErrs, resourceError(c.name, c.err))
		case c.w != nil:
			ss.in.canonWorkload(c.w)
			b.upsertWorkload(c.w)
		default:
			ss.in.canonService(c.s)
			b.upsertService(c.s)
		}
	}
	serial = b.finish()

	ps := &Store{}
	b = newBuilder(old)
	remove(b)
	parallelErrs = ps.indexParallel(b, convert())
	b.parallel = true
	parallel = b.finishParallel()
	return serial, parallel, serialErrs, parallelErrs
}

// mesh is n workloads over 20 nodes and 50 services with single-IP and CIDR
// VIPs; rev changes which of them move node, service, IP and port. Every
// 50th workload shares its IP with the one before (the later upsert wins),
// every 40th is host-network.
func mesh(n int, rev int) []*workloadapi.Address {
	var as []*workloadapi.Address
	for s := 0; s < 50; s++ {
		vip := fmt.Sprintf("10.96.%d.%d", rev%3, s)
		a := svc("ns", fmt.Sprintf("svc-%d", s), vip, 80, uint32(8080+rev%2))
		if s%10 == 0 {
			a.GetService().Addresses = append(a.GetService().Addresses, &workloadapi.NetworkAddress{
				Address: netip.MustParseAddr(fmt.Sprintf("10.%d.%d.0", 200+rev%2, s)).AsSlice(), Length: new(uint32(24))})
		}
		as = append(as, a)
	}
	for i := 0; i < n; i++ {
		j := i
		if i%50 == 49 {
			j = i - 1
		}
		ipAddr := netip.AddrFrom4([4]byte{10, byte(1 + (rev+i)%2), byte(j >> 8), byte(j)})
		opts := []wopt{onNode(fmt.Sprintf("node-%d", (i+rev*(i%3))%20)), inService(svcKey("ns", fmt.Sprintf("svc-%d", (i+rev)%50)), 80, 8080)}
		if i%40 == 0 {
			opts = append(opts, func(w *workloadapi.Workload) { w.NetworkMode = workloadapi.NetworkMode_HOST_NETWORK })
		}
		as = append(as, pod("ns", fmt.Sprintf("p-%d", i), ipAddr.String(), opts...))
	}
	return as
}

func TestParallelIndexMatchesSerial(t *testing.T) {
	const n = 3*indexChunk + 500
	empty := emptySnapshot()
	first := mesh(n, 0)

	// A full sync into an empty store.
	s1, p1, se, pe := buildBoth(t, empty, first, nil)
	if !reflect.DeepEqual(contentsOf(s1), contentsOf(p1)) {
		t.Fatal("full sync: the parallel build differs from the serial one")
	}
	if !reflect.DeepEqual(se, pe) || len(se) == 0 {
		t.Errorf("full sync errors: serial %d, parallel %d (want equal, some)", len(se), len(pe))
	}
	if s1.NumWorkloads() < n-n/90 || len(s1.servicePfx.vips()) == 0 {
		t.Fatalf("full sync built %d workloads, %d CIDR VIPs: the test mesh is wrong", s1.NumWorkloads(), len(s1.servicePfx.vips()))
	}

	// Then a large update onto that state: most resources replaced (node,
	// service, IP, ports moved), some removed, new ones added.
	second := mesh(n+700, 1)[:len(mesh(n+700, 1))-300]
	var removes []string
	for i := 5; i < n; i += 211 {
		removes = append(removes, uid("ns", fmt.Sprintf("p-%d", i)))
	}
	removes = append(removes, svcKey("ns", "svc-7"), "no-such-resource")
	s2, p2, se, pe := buildBoth(t, s1, second, removes)
	if !reflect.DeepEqual(contentsOf(s2), contentsOf(p2)) {
		t.Fatal("update: the parallel build differs from the serial one")
	}
	if !reflect.DeepEqual(se, pe) {
		t.Errorf("update errors differ: serial %d, parallel %d", len(se), len(pe))
	}
	if reflect.DeepEqual(contentsOf(s1), contentsOf(s2)) {
		t.Fatal("the update changed nothing: the test is wrong")
	}
	if p2.Generation != s1.Generation+1 || p2.changed == nil {
		t.Errorf("parallel snapshot generation %d (want %d), changed channel %v", p2.Generation, s1.Generation+1, p2.changed)
	}
}

// BenchmarkIndex100k times only the index build of a 100k-workload full sync
// (conversion excluded), serial as before and with indexParallel.
func BenchmarkIndex100k(b *testing.B) {
	mesh := statetest.Mesh(statetest.Config{})
	ins := make([]*workloadapi.Address, 0, len(mesh))
	names := make([]string, 0, len(mesh))
	for n, a := range mesh {
		ins, names = append(ins, a), append(names, n)
	}
	convert := func() []converted {
		out := make([]converted, len(ins))
		in := interner{validateOnly: true}
		for i := range ins {
			out[i].name = names[i]
			convertAddress(&in, ins[i], &out[i])
		}
		return out
	}
	for _, parallel := range []bool{false, true} {
		b.Run(map[bool]string{false: "serial", true: "parallel"}[parallel], func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				out := convert()
				s := NewStore()
				bl := newBuilder(s.cur.Load())
				bl.workloads.expect(100_000)
				bl.workloadIP.expect(100_000)
				runtime.GC()
				b.StartTimer()
				if parallel {
					s.indexParallel(bl, out)
					bl.parallel = true
				} else {
					for _, c := range out {
						if c.w != nil {
							s.in.canonWorkload(c.w)
							bl.upsertWorkload(c.w)
						} else if c.s != nil {
							s.in.canonService(c.s)
							bl.upsertService(c.s)
						}
					}
				}
				s.publish(bl)
			}
		})
	}
}
