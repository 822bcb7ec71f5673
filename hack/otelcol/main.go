// Command otelcol is a minimal OpenTelemetry Collector for the e2e tests: the
// Collector's own OTLP receiver (gRPC and HTTP) and one exporter of ours,
// spanfile, that appends every batch it receives to a file as OTLP JSON, one
// batch a line, so a test reads what a real collector received. Built by
// build.sh into a cache directory outside the repository.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "ztunnel-go test collector", Version: "0.165.0"},
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			// env: the collector's default scheme for ${...} in the config.
			ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
		}},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func factories() (otelcol.Factories, error) {
	recv := otlpreceiver.NewFactory()
	exp := newSpanFileFactory()
	return otelcol.Factories{
		Receivers: map[component.Type]receiver.Factory{recv.Type(): recv},
		Exporters: map[component.Type]exporter.Factory{exp.Type(): exp},
		Telemetry: otelconftelemetry.NewFactory(),
	}, nil
}

// spanFileConfig is the spanfile exporter's config: the file it appends to.
type spanFileConfig struct {
	Path string `mapstructure:"path"`
}

func (c *spanFileConfig) Validate() error {
	if c.Path == "" {
		return errors.New("spanfile: path is required")
	}
	return nil
}

func newSpanFileFactory() exporter.Factory {
	return exporter.NewFactory(component.MustNewType("spanfile"),
		func() component.Config { return &spanFileConfig{} },
		exporter.WithTraces(func(_ context.Context, _ exporter.Settings, cfg component.Config) (exporter.Traces, error) {
			return &spanFile{path: cfg.(*spanFileConfig).Path}, nil
		}, component.StabilityLevelDevelopment),
		exporter.WithLogs(func(_ context.Context, _ exporter.Settings, cfg component.Config) (exporter.Logs, error) {
			return &spanFile{path: cfg.(*spanFileConfig).Path}, nil
		}, component.StabilityLevelDevelopment),
	)
}

// spanFile appends each batch as one line of OTLP JSON
// ({"resourceSpans":[...]} or {"resourceLogs":[...]}), synced before the
// pipeline is told it was delivered.
type spanFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func (s *spanFile) Start(context.Context, component.Host) error {
	f, err := os.OpenFile(s.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("spanfile: %w", err)
	}
	s.f = f
	return nil
}

func (s *spanFile) Shutdown(context.Context) error {
	if s.f == nil {
		return nil
	}
	return s.f.Close()
}

func (s *spanFile) Capabilities() consumer.Capabilities { return consumer.Capabilities{} }

func (s *spanFile) ConsumeTraces(_ context.Context, td ptrace.Traces) error {
	b, err := (&ptrace.JSONMarshaler{}).MarshalTraces(td)
	if err != nil {
		return err
	}
	return s.write(b)
}

func (s *spanFile) ConsumeLogs(_ context.Context, ld plog.Logs) error {
	b, err := (&plog.JSONMarshaler{}).MarshalLogs(ld)
	if err != nil {
		return err
	}
	return s.write(b)
}

func (s *spanFile) write(b []byte) error {
	if !json.Valid(b) {
		return errors.New("spanfile: marshaled batch is not JSON")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.f.Write(append(b, '\n')); err != nil {
		return err
	}
	return s.f.Sync()
}
