package testcluster

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// TB is what New needs from its caller: testing.TB satisfies it, and Program
// provides it for the demo and benchmark programs.
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
// write to Out, Fatalf runs the cleanups and exits with status 1, and Close
// runs the cleanups (last registered first) and removes the temp dirs. Create
// it with NewProgram and defer Close.
type Program struct {
	name string
	out  io.Writer

	mu       sync.Mutex
	failed   bool
	cleanups []func()
	tmp      []string
}

// NewProgram returns a Program whose cluster names derive from name; out nil
// means os.Stderr.
func NewProgram(name string, out io.Writer) *Program {
	if out == nil {
		out = os.Stderr
	}
	return &Program{name: name, out: out}
}

func (p *Program) Helper()      {}
func (p *Program) Name() string { return p.name }

func (p *Program) Logf(format string, args ...any) {
	fmt.Fprintf(p.out, format+"\n", args...)
}

func (p *Program) Errorf(format string, args ...any) {
	p.mu.Lock()
	p.failed = true
	p.mu.Unlock()
	p.Logf(format, args...)
}

// Fatalf logs, cleans up and exits the process with status 1.
func (p *Program) Fatalf(format string, args ...any) {
	p.Errorf(format, args...)
	p.Close()
	os.Exit(1)
}

func (p *Program) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// TempDir creates a new temporary directory, removed by Close.
func (p *Program) TempDir() string {
	dir, err := os.MkdirTemp("", "testcluster-")
	if err != nil {
		p.Fatalf("testcluster: %v", err)
	}
	p.mu.Lock()
	p.tmp = append(p.tmp, dir)
	p.mu.Unlock()
	return dir
}

func (p *Program) Cleanup(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, fn)
}

// Close runs the registered cleanups, last first, then removes the temp
// dirs. Safe to call more than once.
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
