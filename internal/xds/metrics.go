package xds

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Connection termination reasons (label "reason" of
// istio_xds_connection_terminations_total), spelled like Istio's ztunnel.
const (
	// ReasonConnectionError: no response arrived on the stream (dial, TLS,
	// authentication or the server went away before answering).
	ReasonConnectionError = "ConnectionError"
	// ReasonError: the stream failed after it had been serving.
	ReasonError = "Error"
	// ReasonComplete: the server ended the stream cleanly.
	ReasonComplete = "Complete"
)

type clientMetrics struct {
	terminations *prometheus.CounterVec
	messages     *prometheus.CounterVec
	bytes        *prometheus.CounterVec
}

func newClientMetrics(reg prometheus.Registerer) (*clientMetrics, error) {
	m := &clientMetrics{
		terminations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_xds_connection_terminations_total",
			Help: "xDS streams to the control plane that ended, by reason.",
		}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_xds_message_total",
			Help: "xDS responses received, by type URL.",
		}, []string{"url"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_xds_message_bytes_total",
			Help: "Encoded size of the xDS responses received, by type URL.",
		}, []string{"url"}),
	}
	if err := RegisterMetrics(reg, m.terminations, m.messages, m.bytes); err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	return m, nil
}

// RegisterMetrics registers every collector of cs with reg (nil: none)
// and returns every error, joined.
func RegisterMetrics(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	return nil
}
