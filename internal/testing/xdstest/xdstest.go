// Package xdstest holds Sink, an in-memory xds.Sink that keeps the latest
// WDS addresses and authorizations a real xds.Client received, for tests that
// run a control plane and watch what it serves (internal/controlplane, e2e/).
//
// It is test support: it decodes nothing itself, accepts every resource (a
// test that needs NACKs writes its own sink) and is never linked into a
// product binary.
package xdstest

import (
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Sink keeps resources by name. Its methods are safe for concurrent use.
type Sink struct {
	mu      sync.Mutex
	addrs   map[string]*workloadapi.Address
	authz   map[string]*securityapi.Authorization
	changed chan struct{} // closed and replaced on every apply
}

// NewSink returns an empty Sink.
func NewSink() *Sink {
	return &Sink{
		addrs:   map[string]*workloadapi.Address{},
		authz:   map[string]*securityapi.Authorization{},
		changed: make(chan struct{}),
	}
}

// ApplyAddresses upserts and removes addresses; it never rejects one.
func (s *Sink) ApplyAddresses(up map[string]*workloadapi.Address, rm []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	apply(s.addrs, up, rm)
	s.notifyLocked()
	return nil
}

// ApplyAuthorizations upserts and removes authorizations; it never rejects
// one.
func (s *Sink) ApplyAuthorizations(up map[string]*securityapi.Authorization, rm []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	apply(s.authz, up, rm)
	s.notifyLocked()
	return nil
}

func apply[V any](m map[string]V, up map[string]V, rm []string) {
	for k, v := range up {
		m[k] = v
	}
	for _, k := range rm {
		delete(m, k)
	}
}

func (s *Sink) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Address returns the address named name, or nil.
func (s *Sink) Address(name string) *workloadapi.Address {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[name]
}

// Authorization returns the authorization named name ("ns/name"), or nil.
func (s *Sink) Authorization(name string) *securityapi.Authorization {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.authz[name]
}

// WaitFor returns once cond holds, checking it now and after every apply
// (the wait is taken before each check, so no change is missed); it fails t
// naming what when timeout passes first. cond reads the sink through its
// methods.
func (s *Sink) WaitFor(t testkit.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
			return
		}
	}
}
