package state_test

import (
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/statetest"
)

// BenchmarkApply100k measures a full WDS sync of 100k workloads and 10k
// services into an empty store (protos already decoded), and reports the
// retained state per workload (services included) after GC.
func BenchmarkApply100k(b *testing.B) {
	cfg := statetest.Config{}
	var bytesPerWorkload float64
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		mesh := statetest.Mesh(cfg)
		runtime.GC()
		cpu0 := cpuTime()
		b.StartTimer()

		s := state.NewStore()
		if err := s.ApplyAddresses(mesh, nil); err != nil {
			b.Fatal(err)
		}

		b.StopTimer()
		cpu += cpuTime() - cpu0
		mesh = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		if n := s.Load().NumWorkloads(); n != 100_000 {
			b.Fatalf("%d workloads", n)
		}
		bytesPerWorkload = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / 100_000
		runtime.KeepAlive(s)
		b.StartTimer()
	}
	b.ReportMetric(bytesPerWorkload, "B/workload")
	// CPU time of the whole process (GC workers included): a figure that a
	// busy shared machine distorts less than wall time.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkUpdateOne100k measures a one-workload update on a 100k snapshot:
// it must cost a few shard clones, not a rebuild.
func BenchmarkUpdateOne100k(b *testing.B) {
	cfg := statetest.Config{}
	s := state.NewStore()
	if err := s.ApplyAddresses(statetest.Mesh(cfg), nil); err != nil {
		b.Fatal(err)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		up := map[string]*workloadapi.Address{statetest.WorkloadUID(cfg, i%100_000): statetest.Workload(cfg, i%100_000, uint32(i))}
		if err := s.ApplyAddresses(up, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSelectEndpoint is the per-connection LB cost on a 100k snapshot.
func BenchmarkSelectEndpoint(b *testing.B) {
	cfg := statetest.Config{}
	s := state.NewStore()
	if err := s.ApplyAddresses(statetest.Mesh(cfg), nil); err != nil {
		b.Fatal(err)
	}
	snap := s.Load()
	svc := snap.ServiceByHost(statetest.ServiceName(cfg, 42))
	src := snap.WorkloadByUID(statetest.WorkloadUID(cfg, 7))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := snap.SelectEndpoint(svc, 80, src, nil); err != nil {
			b.Fatal(err)
		}
	}
}
