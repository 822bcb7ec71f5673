package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// DefaultAddr is istiod's webhook port.
const DefaultAddr = ":15017"

// ConfigurationName is the chart's ValidatingWebhookConfiguration, whose
// caBundle Server keeps set to the root certificate.
const ConfigurationName = "ztunnel-go-validation"

// ServerConfig configures a Server. Addr, Cert and CABundle are required.
type ServerConfig struct {
	// Addr is the HTTPS listen address (DefaultAddr in the chart).
	Addr string
	// Cert is the serving certificate; the API server calls the Service
	// name (ztunnel-cp.<namespace>.svc), which it must cover.
	Cert tls.Certificate
	// CABundle is the PEM root that signed Cert.
	CABundle []byte
	// Client patches ConfigurationName's caBundle; nil: not patched (the
	// configuration carries its own).
	Client kubernetes.Interface
	// Validation configures Handler.
	Validation Config
	// Retries lists the caBundle patch loop on the daemon's readiness page;
	// nil: a Retry of its own that logs to Log.
	Retries *backoff.Set
	// Log: nil means no logging.
	Log *zap.Logger
}

// Server serves Handler over HTTPS and keeps the webhook configuration's
// caBundle current, as istiod patches its own.
type Server struct {
	cfg ServerConfig
	log *zap.Logger
}

// NewServer checks cfg.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Addr == "" || len(cfg.Cert.Certificate) == 0 || len(cfg.CABundle) == 0 {
		return nil, errors.New("webhook: Addr, Cert and CABundle are required")
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	cfg.Validation.Log = log
	return &Server{cfg: cfg, log: log}, nil
}

// Run serves until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	lis, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("webhook: listen %s: %w", s.cfg.Addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+Path, Handler(s.cfg.Validation))
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{s.cfg.Cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	if s.cfg.Client != nil {
		go s.patchUntilDone(ctx)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(lis, "", "") }()
	s.log.Info("serving the validating admission webhook", zap.Stringer("addr", lis.Addr()))
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		return fmt.Errorf("webhook: serve %s: %w", s.cfg.Addr, err)
	}
}

// patchUntilDone sets the caBundle, retrying (the configuration may be
// created after the control plane starts), then re-checks every minute.
func (s *Server) patchUntilDone(ctx context.Context) {
	// Failures back off from 1 s to a minute, logged once per step; once
	// set, the bundle is checked again every minute.
	policy := backoff.Policy{Initial: time.Second, Max: time.Minute}
	retry := backoff.New("webhook caBundle", policy, s.log)
	if s.cfg.Retries != nil {
		retry = s.cfg.Retries.New("webhook caBundle", policy)
	}
	for {
		wait := time.Minute
		if err := PatchCABundle(ctx, s.cfg.Client, ConfigurationName, s.cfg.CABundle); err != nil {
			wait = retry.Failed(fmt.Errorf("%s: %w; the API server refuses the kinds it validates until it is set", ConfigurationName, err))
		} else {
			retry.Succeeded()
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// PatchCABundle sets caBundle on every webhook of ValidatingWebhookConfiguration
// name, writing only when one differs.
func PatchCABundle(ctx context.Context, kc kubernetes.Interface, name string, caPEM []byte) error {
	api := kc.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vwc, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("webhook: get %s: %w", name, err)
	}
	changed := false
	for i := range vwc.Webhooks {
		if string(vwc.Webhooks[i].ClientConfig.CABundle) != string(caPEM) {
			vwc.Webhooks[i].ClientConfig.CABundle = caPEM
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if _, err := api.Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("webhook: update %s: %w", name, err)
	}
	return nil
}
