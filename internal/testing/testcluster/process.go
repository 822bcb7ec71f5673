package testcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Process describes a program to run inside a namespace.
type Process struct {
	// Name names the log file (<StateDir>/logs/<Name>.log) and the process in
	// messages; the base name of Path when empty.
	Name string
	Path string // required
	Args []string
	// Env is added to the test process's environment (later entries win).
	Env []string
	// Dir is the working directory; the test's when empty.
	Dir string
	// StopTimeout is how long Stop waits after SIGTERM before SIGKILL; 5 s
	// when 0.
	StopTimeout time.Duration
}

// Proc is a running (or finished) process started with NetNS.Start. Its
// stdout and stderr go to LogPath; the cluster stops it in t.Cleanup and, if
// the test failed, prints the tail of its log.
type Proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	stopTO  time.Duration

	done     chan struct{}
	err      error // set before done is closed
	stopOnce sync.Once
	stopped  atomic.Bool // Stop was called
	stopErr  error
}

// Start runs p inside the namespace (through `ip netns exec`, so /sys also
// shows the namespace). The process gets its own process group, which Stop
// signals, and dies with the test process (parent-death signal SIGKILL).
func (ns *NetNS) Start(p Process) (*Proc, error) {
	c := ns.c
	if p.Path == "" {
		return nil, errors.New("testcluster: Start: empty Path")
	}
	if _, err := ns.Handle(); err != nil {
		return nil, err
	}
	if p.Name == "" {
		p.Name = filepath.Base(p.Path)
	}
	if p.StopTimeout == 0 {
		p.StopTimeout = 5 * time.Second
	}
	logDir := filepath.Join(c.stateDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	c.mu.Lock()
	logPath := filepath.Join(logDir, p.Name+".log")
	for i := 2; fileExists(logPath); i++ {
		logPath = filepath.Join(logDir, fmt.Sprintf("%s-%d.log", p.Name, i))
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	c.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	defer f.Close() // the child has its own copy

	cmd := exec.Command(c.ipPath, append([]string{"netns", "exec", ns.name, p.Path}, p.Args...)...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Dir = p.Dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testcluster: start %s in %s: %w", p.Path, ns.name, err)
	}
	pr := &Proc{
		name:    p.Name,
		logPath: logPath,
		cmd:     cmd,
		stopTO:  p.StopTimeout,
		done:    make(chan struct{}),
	}
	go func() {
		pr.err = cmd.Wait()
		close(pr.done)
	}()
	c.mu.Lock()
	c.procs = append(c.procs, pr)
	c.mu.Unlock()
	c.t.Logf("testcluster: started %s (pid %d) in %s, log %s", p.Name, cmd.Process.Pid, ns.name, logPath)
	return pr, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// LogPath is the file holding the process's stdout and stderr.
func (p *Proc) LogPath() string { return p.logPath }

// Log returns the log so far.
func (p *Proc) Log() []byte {
	b, _ := os.ReadFile(p.logPath)
	return b
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the exit error once Done is closed (nil for exit status 0).
func (p *Proc) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// WaitLog waits until the log contains substr, the process exits, or ctx
// ends. It polls the file (every 10 ms), so it suits "listening on" lines.
func (p *Proc) WaitLog(ctx context.Context, substr string) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(string(p.Log()), substr) {
			return nil
		}
		select {
		case <-p.done:
			if strings.Contains(string(p.Log()), substr) {
				return nil
			}
			return fmt.Errorf("testcluster: %s exited (%v) before logging %q; log:\n%s", p.name, p.err, substr, tail(p.Log(), 20))
		case <-ctx.Done():
			return fmt.Errorf("testcluster: waiting for %q in %s: %w; log:\n%s", substr, p.name, ctx.Err(), tail(p.Log(), 20))
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM to the process group, waits up to StopTimeout, then
// sends SIGKILL. It returns the exit error, except that dying of our SIGTERM
// counts as success. Safe to call more than once.
func (p *Proc) Stop() error {
	p.stopped.Store(true)
	p.stopOnce.Do(func() {
		pgid := p.cmd.Process.Pid
		select {
		case <-p.done:
			p.stopErr = p.exitErr(false)
			return
		default:
		}
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(p.stopTO)
		defer t.Stop()
		select {
		case <-p.done:
			p.stopErr = p.exitErr(true)
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
			p.stopErr = fmt.Errorf("testcluster: %s ignored SIGTERM for %v and was killed", p.name, p.stopTO)
		}
	})
	return p.stopErr
}

func (p *Proc) exitErr(termSent bool) error {
	if p.err == nil {
		return nil
	}
	var ee *exec.ExitError
	if termSent && errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return fmt.Errorf("testcluster: %s: %w", p.name, p.err)
}
