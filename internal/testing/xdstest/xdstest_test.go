package xdstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

type fatalRecorder struct {
	testkit.TB
	fatal []string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.fatal = append(r.fatal, fmt.Sprintf(format, args...))
}

func TestSinkKeepsLatest(t *testing.T) {
	s := NewSink()
	w := &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{Uid: "u1"}}}
	if err := s.ApplyAddresses(map[string]*workloadapi.Address{"u1": w, "u2": w}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.ApplyAddresses(nil, []string{"u2"}); err != nil {
		t.Fatal(err)
	}
	if s.Address("u1") != w || s.Address("u2") != nil {
		t.Errorf("Address(u1)=%v Address(u2)=%v, want u1 kept and u2 removed", s.Address("u1"), s.Address("u2"))
	}
	p := &securityapi.Authorization{Name: "p", Namespace: "ns"}
	if err := s.ApplyAuthorizations(map[string]*securityapi.Authorization{"ns/p": p}, nil); err != nil {
		t.Fatal(err)
	}
	if s.Authorization("ns/p") != p {
		t.Errorf("Authorization(ns/p) = %v", s.Authorization("ns/p"))
	}
}

func TestWaitForWakesOnApply(t *testing.T) {
	s := NewSink()
	go func() {
		time.Sleep(10 * time.Millisecond)
		_ = s.ApplyAuthorizations(map[string]*securityapi.Authorization{"ns/p": {Name: "p"}}, nil)
	}()
	s.WaitFor(t, 10*time.Second, "ns/p", func() bool { return s.Authorization("ns/p") != nil })

	r := &fatalRecorder{}
	s.WaitFor(r, 20*time.Millisecond, "ns/never", func() bool { return s.Authorization("ns/never") != nil })
	if len(r.fatal) != 1 || r.fatal[0] != "timed out after 20ms waiting for ns/never" {
		t.Errorf("fatal = %q", r.fatal)
	}
}
