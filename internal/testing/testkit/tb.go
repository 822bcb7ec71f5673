// Package testkit holds the helpers every test and test harness in this
// repository shares, each written once: TB, the part of testing.TB the
// harnesses (testcluster, kubeapi, meshlab) take, with Program as the TB for
// main packages (the demo, bench/); Eventually, a bounded wait for an eventual
// state; and BuildBinaries, which builds this module's commands for tests
// that run the real binaries. It is test support: it is never linked into a
// product binary (ztunnel, ztunnel-cni, ztunnel-cp, zctl).
package testkit

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// TB is what the harnesses need from their caller: testing.TB satisfies it,
// and Program provides it for the demo and benchmark programs.
type TB interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
	TempDir() string
	Cleanup(func())
}

// Program is a TB for main packages (bench/, the demo): Logf and Errorf
// write a line to Out, Fatalf runs the cleanups and exits with status 1, and
// Close runs the cleanups (last registered first) and removes the temp dirs.
// Create it with NewProgram and defer Close. Its methods are safe for
// concurrent use.
type Program struct {
	name string
	out  io.Writer

	mu       sync.Mutex // guards the fields below and serialises writes to out
	failed   bool
	cleanups []func()
	tmp      []string
}

var _ TB = (*Program)(nil)

// NewProgram returns a Program whose Name is name (harnesses derive their
// resource names from it); out nil means os.Stderr.
func NewProgram(name string, out io.Writer) *Program {
	if out == nil {
		out = os.Stderr
	}
	return &Program{name: name, out: out}
}

// Helper does nothing: a program has no test frames to hide.
func (p *Program) Helper() {}

// Name returns the name given to NewProgram.
func (p *Program) Name() string { return p.name }

// Logf writes one line to the program's output.
func (p *Program) Logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = io.WriteString(p.out, line)
}

// Errorf logs and marks the program failed.
func (p *Program) Errorf(format string, args ...any) {
	p.mu.Lock()
	p.failed = true
	p.mu.Unlock()
	p.Logf(format, args...)
}

// Fatalf logs, runs the cleanups (Close) and exits the process with status 1.
func (p *Program) Fatalf(format string, args ...any) {
	p.Errorf(format, args...)
	p.Close()
	os.Exit(1)
}

// Failed reports whether Errorf or Fatalf was called.
func (p *Program) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// TempDir creates a new temporary directory, removed by Close.
func (p *Program) TempDir() string {
	dir, err := os.MkdirTemp("", "testkit-")
	if err != nil {
		p.Fatalf("testkit: temp dir: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tmp = append(p.tmp, dir)
	return dir
}

// Cleanup registers fn to run at Close, after the ones registered later.
func (p *Program) Cleanup(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, fn)
}

// Close runs the registered cleanups, last first (a cleanup may register
// more), then removes the temp dirs. Safe to call more than once.
func (p *Program) Close() {
	for {
		p.mu.Lock()
		if len(p.cleanups) == 0 {
			tmp := p.tmp
			p.tmp = nil
			p.mu.Unlock()
			for _, d := range tmp {
				_ = os.RemoveAll(d)
			}
			return
		}
		fn := p.cleanups[len(p.cleanups)-1]
		p.cleanups = p.cleanups[:len(p.cleanups)-1]
		p.mu.Unlock()
		fn()
	}
}
