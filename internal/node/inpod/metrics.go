package inpod

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the workload manager's own metrics (Istio's ztunnel exports
// the same four under its workload_manager sub-registry).
type metrics struct {
	active  prometheus.Gauge
	pending prometheus.Gauge
	started prometheus.Counter
	stopped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "workload_manager_active_proxy_count", Help: "The number of pods whose proxy is running.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "workload_manager_pending_proxy_count", Help: "The number of pods whose proxy failed to start and is being retried.",
		}),
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "workload_manager_proxies_started_total", Help: "The total number of pod proxies started.",
		}),
		stopped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "workload_manager_proxies_stopped_total", Help: "The total number of pod proxies stopped.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.active, m.pending, m.started, m.stopped} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("inpod: register metrics: %w", err)
	}
	return m, nil
}
