package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// churnResult is what the churn phase measured.
type churnResult struct {
	pods     int           // short-lived pods that made their round trip
	took     time.Duration // the whole phase
	peak     int           // istio_* series of both node proxies, highest sample
	end      int           // the same after the grace and a settle
	left     int           // of those, series naming a churned workload
	perPodMS float64       // wall time per pod, create to delete
}

// churn runs cfg.churn short-lived client pods through node0, cfg.churnPar
// at a time: each is created (CNI ADD, ZDS hand-off to the node proxy),
// opens one tunnel to the server and echoes, then is deleted (CNI DEL).
// Every pod is a new workload (name and UID of its own, an address reused
// as a node's IPAM does), so each leaves source and destination series in
// both node proxies; the series count is sampled meanwhile. After the last
// pod the phase waits the proxies' deleted-workload grace (cfg.metricsGrace,
// given to them as METRICS_DELETED_WORKLOAD_GRACE) plus a settle, and
// counts the series again: bounded, the churned workloads' series are gone.
func (s *soak) churn() (churnResult, error) {
	cfg := s.cfg
	var res churnResult
	start := time.Now()
	var next, done atomic.Int64
	peak := 0 // the sampler's alone until sampler.Wait
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			n, err := s.watch.istioSeries()
			if err != nil {
				logf("churn: counting series: %v", err)
				continue
			}
			peak = max(peak, n)
			logf("churn: %d/%d pods, %d istio_* series", done.Load(), cfg.churn, n)
		}
	}()
	var wg sync.WaitGroup
	for range cfg.churnPar {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > cfg.churn {
					return
				}
				if err := s.churnOne(i); err != nil {
					s.errors.add("churn", 0, i, err)
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	res.took = time.Since(start)
	res.pods = int(done.Load())
	if res.pods > 0 {
		res.perPodMS = float64(res.took.Milliseconds()) * float64(cfg.churnPar) / float64(res.pods)
	}
	n, err := s.watch.istioSeries()
	if err != nil {
		return res, err
	}
	res.peak = max(peak, n)
	logf("churn: %d pods in %v, %d series at the end of it; waiting the %v grace", res.pods, res.took.Round(time.Second), n, cfg.metricsGrace)
	// The node proxies sweep deleted workloads' series once a grace
	// period: after two of them every churned workload's are due.
	time.Sleep(2*cfg.metricsGrace + 5*time.Second)
	if res.end, err = s.watch.istioSeries(); err != nil {
		return res, err
	}
	if res.left, err = s.churnedSeries(); err != nil {
		return res, err
	}
	return res, nil
}

// churnedSeries counts the istio_* series of both node proxies that still
// name a churned pod's workload, and logs a few.
func (s *soak) churnedSeries() (int, error) {
	nodes, err := s.watch.nodeMetrics()
	if err != nil {
		return 0, err
	}
	n := 0
	for i, mfs := range nodes {
		for name, mf := range mfs {
			if !strings.HasPrefix(name, "istio_") {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if strings.HasPrefix(l.GetValue(), churnPrefix) {
						if n++; n <= 3 {
							logf("churn: node%d still has %s%v", i, name, m.GetLabel())
						}
						break
					}
				}
			}
		}
	}
	return n, nil
}

// churnPrefix starts every churned pod's name.
const churnPrefix = "churn-"

// churnOne is one short-lived pod: create, one echoed tunnel, delete.
func (s *soak) churnOne(i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := fmt.Sprintf("%s%d", churnPrefix, i)
	p, err := s.m.AddPod(ctx, 0, testcluster.PodSpec{Name: name, Namespace: "soak"})
	if err != nil {
		if p != nil {
			_ = p.Delete(ctx)
		}
		return fmt.Errorf("create %s: %w", name, err)
	}
	want := []byte("churn " + name)
	got, rerr := meshlab.RoundTrip(ctx, p, s.dst, want)
	if rerr == nil && string(got) != string(want) {
		rerr = fmt.Errorf("echo %q, want %q", got, want)
	}
	if err := p.Delete(ctx); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	if rerr != nil {
		return fmt.Errorf("%s round trip: %w", name, rerr)
	}
	return nil
}

// setChurnEnv gives the node proxies (started after it, inheriting this
// process's environment) the deleted-workload grace of the churn phase.
func setChurnEnv(cfg config) error {
	if cfg.churn == 0 {
		return nil
	}
	return os.Setenv("METRICS_DELETED_WORKLOAD_GRACE", cfg.metricsGrace.String())
}
