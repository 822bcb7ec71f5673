package main

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
	"github.com/ztunnel-go/ztunnel-go/internal/otlp"
	"github.com/ztunnel-go/ztunnel-go/proxy/conntrace"
)

// newTracer starts the connection spans' export when TRACING_ENDPOINT is
// set. Every span names this node and cluster, as Istio's proxies' spans
// name theirs.
func newTracer(cfg *config.Config, log *zap.Logger) (*conntrace.Tracer, error) {
	if cfg.TracingEndpoint == "" {
		return nil, nil
	}
	otel.SetErrorHandler(conntrace.LogErrors(log))
	t, err := conntrace.New(conntrace.Config{
		Endpoint:           otlp.Endpoint{Address: cfg.TracingEndpoint, Protocol: cfg.TracingProtocol},
		SamplingPercentage: cfg.TracingSampling,
		Attributes: []attribute.KeyValue{attribute.String("node_id", cfg.NodeName),
			attribute.String("istio.cluster_id", cfg.ClusterID), attribute.String("component", "ztunnel")},
	})
	if err != nil {
		return nil, err
	}
	log.Info("connection spans on", zap.String("endpoint", cfg.TracingEndpoint), zap.Stringer("protocol", cfg.TracingProtocol),
		zap.Float64("sampling", cfg.TracingSampling))
	return t, nil
}

// closeTracer exports the spans still queued, for 5 s at most.
func closeTracer(t *conntrace.Tracer, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.Close(ctx); err != nil {
		log.Warn("flushing connection spans", zap.Error(err))
	}
}
