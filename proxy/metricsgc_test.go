package proxy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

func gcWorkload(uid, name, ns string, ip byte) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: uid, Name: name + "-pod", WorkloadName: name, Namespace: ns,
		Addresses: [][]byte{{10, 0, 0, ip}}, ServiceAccount: name, Node: "n1",
	}}}
}

// record closes one connection src → dst in m's counters.
func record(m *Metrics, src, dst string) {
	r := NewResult(m, nil, Inbound, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:2"))
	r.Src, r.Dst = Peer{Workload: src, Namespace: "apps"}, Peer{Workload: dst, Namespace: "apps"}
	r.Record(nil)
}

// countMatching counts v's series carrying every label of want.
func countMatching(t *testing.T, v *prometheus.CounterVec, want prometheus.Labels) int {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { v.Collect(ch); close(ch) }()
	n := 0
	for mt := range ch {
		var d dto.Metric
		if err := mt.Write(&d); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, l := range d.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, val := range want {
			if got[k] != val {
				ok = false
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// TestDropDeletedWorkloads: the series of a workload the state no longer
// holds go after the grace, not before, not while an open connection still
// reports under it, and not those of a workload that came back or that the
// state never held (a remote peer known from baggage).
func TestDropDeletedWorkloads(t *testing.T) {
	store := state.NewStore()
	if err := store.ApplyAddresses(map[string]*workloadapi.Address{
		"u-client": gcWorkload("u-client", "client", "apps", 1),
		"u-server": gcWorkload("u-server", "server", "apps", 2),
		"u-back":   gcWorkload("u-back", "back", "apps", 3),
		"u-held":   gcWorkload("u-held", "held", "apps", 4),
	}, nil); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	record(m, "client", "server")
	record(m, "client", "back")
	record(m, "remote", "client") // "remote" was never in the state
	// An open connection to "held" (opened, not closed yet).
	open := NewResult(m, nil, Inbound, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.4:2"))
	open.Src, open.Dst = Peer{Workload: "client", Namespace: "apps"}, Peer{Workload: "held", Namespace: "apps"}
	open.Opened()

	const grace = 400 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { m.DropDeletedWorkloads(ctx, store, grace, nil); close(done) }()
	time.Sleep(3 * grace / 4) // the GC has read the state with every workload in it

	deleted := time.Now()
	if err := store.ApplyAddresses(nil, []string{"u-server", "u-back", "u-held"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(grace / 4)
	if err := store.ApplyAddresses(map[string]*workloadapi.Address{"u-back2": gcWorkload("u-back2", "back", "apps", 5)}, nil); err != nil {
		t.Fatal(err)
	}
	if n := countMatching(t, m.closed, prometheus.Labels{"destination_workload": "server"}); n != 1 {
		t.Fatalf("server's series before the grace: %d, want 1", n)
	}
	testkit.Eventually(t, 5*time.Second, "server's series to be dropped", func() bool {
		return countMatching(t, m.closed, prometheus.Labels{"destination_workload": "server"}) == 0
	})
	if since := time.Since(deleted); since < grace {
		t.Fatalf("dropped %v after the deletion, before the %v grace", since, grace)
	}
	time.Sleep(grace)
	for _, tc := range []struct {
		labels prometheus.Labels
		want   int
	}{
		{prometheus.Labels{"destination_workload": "back"}, 1}, // came back within the grace
		{prometheus.Labels{"source_workload": "remote"}, 1},    // never in the state
		{prometheus.Labels{"source_workload": "client"}, 1},    // client → back; client → server went with server
	} {
		if n := countMatching(t, m.closed, tc.labels); n != tc.want {
			t.Errorf("series %v: %d, want %d", tc.labels, n, tc.want)
		}
	}
	if n := countMatching(t, m.opened, prometheus.Labels{"destination_workload": "held"}); n != 1 {
		t.Fatalf("the open connection's series to held: %d, want 1 (kept while it is open)", n)
	}
	open.Record(nil)
	testkit.Eventually(t, 5*time.Second, "held's series to go once its connection closed", func() bool {
		return countMatching(t, m.opened, prometheus.Labels{"destination_workload": "held"}) == 0 &&
			countMatching(t, m.closed, prometheus.Labels{"destination_workload": "held"}) == 0
	})
	cancel()
	<-done
}

// TestDropShortLivedWorkloads: a workload that enters the state, carries
// connections and leaves it again between two of the GC's reads of the
// state (a pod living for less than a tick, as bench/soak's churn makes
// thousands of) still has its series dropped after the grace; one that
// failed before opening too. Found by `bench/soak -churn`: every churned
// pod's series stayed.
func TestDropShortLivedWorkloads(t *testing.T) {
	store := state.NewStore()
	if err := store.ApplyAddresses(map[string]*workloadapi.Address{"u-server": gcWorkload("u-server", "server", "apps", 2)}, nil); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	const grace = 800 * time.Millisecond // a tick of 200 ms
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { m.DropDeletedWorkloads(ctx, store, grace, nil); close(done) }()
	defer func() { cancel(); <-done }()
	time.Sleep(250 * time.Millisecond) // the GC has read the state once

	for i, name := range []string{"blink", "blink-failed"} {
		uid := "u-" + name
		if err := store.ApplyAddresses(map[string]*workloadapi.Address{uid: gcWorkload(uid, name, "apps", byte(10+i))}, nil); err != nil {
			t.Fatal(err)
		}
		snap := store.Load()
		r := NewResult(m, nil, Outbound, netip.MustParseAddrPort("10.0.0.10:1"), netip.MustParseAddrPort("10.0.0.2:2"))
		r.Src = peerOf(snap.WorkloadByUID(uid))
		r.Dst = peerOf(snap.WorkloadByUID("u-server"))
		var err error
		if name == "blink" {
			r.Opened()
		} else {
			err = WithReason(ReasonConnectFailed, context.DeadlineExceeded)
		}
		r.Record(&err)
		if err := store.ApplyAddresses(nil, []string{uid}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"blink", "blink-failed"} {
		if n := countMatching(t, m.opened, prometheus.Labels{"source_workload": name}); n != 1 {
			t.Fatalf("%s's series right after: %d, want 1", name, n)
		}
	}
	testkit.Eventually(t, 5*time.Second, "the short-lived workloads' series to be dropped", func() bool {
		return countMatching(t, m.opened, prometheus.Labels{"source_workload": "blink"}) == 0 &&
			countMatching(t, m.closed, prometheus.Labels{"source_workload": "blink-failed"}) == 0
	})
	if n := countMatching(t, m.opened, prometheus.Labels{"destination_workload": "server"}); n != 0 {
		t.Errorf("series to server left: %d, want 0 (each named a dropped source)", n)
	}
}
