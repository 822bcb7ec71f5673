package benchkit

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// Reaper holds the child processes and temporary directories a benchmark
// still owns, so that a signal can clean them up (normal paths stop and
// remove them with defers; children also get SIGKILL through Pdeathsig if
// the benchmark dies without cleaning up). A nil *Reaper tracks nothing.
type Reaper struct {
	mu    sync.Mutex
	procs map[*os.Process]bool
	dirs  map[string]bool
}

// Track adds p to what a signal kills.
func (r *Reaper) Track(p *os.Process) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.procs == nil {
		r.procs = map[*os.Process]bool{}
	}
	r.procs[p] = true
}

// Untrack removes p (it has been reaped).
func (r *Reaper) Untrack(p *os.Process) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.procs, p)
}

// TempDir makes a tracked temporary directory named after prefix.
func (r *Reaper) TempDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil || r == nil {
		return dir, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dirs == nil {
		r.dirs = map[string]bool{}
	}
	r.dirs[dir] = true
	return dir, nil
}

// RemoveDir removes a directory made by TempDir ("" is ignored).
func (r *Reaper) RemoveDir(dir string) {
	if dir == "" {
		return
	}
	os.RemoveAll(dir)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.dirs, dir)
}

// OnSignal kills every tracked child and removes every tracked directory
// when SIGINT, SIGTERM or SIGHUP arrives, says so on stderr as name, then
// exits with status 130.
func (r *Reaper) OnSignal(name string) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigs
		r.mu.Lock()
		for p := range r.procs {
			p.Kill()
			p.Wait()
		}
		for d := range r.dirs {
			os.RemoveAll(d)
		}
		r.mu.Unlock()
		fmt.Fprintf(os.Stderr, "%s: %v: children stopped, temporary directories removed\n", name, s)
		os.Exit(130)
	}()
}

// Child is a child process that talks to its parent line by line: the
// parent writes commands to its stdin and reads one answer line each from
// its stdout; its stderr is the parent's.
type Child struct {
	Cmd *exec.Cmd
	r   *Reaper
	in  io.WriteCloser
	out *bufio.Reader
}

// StartChild starts cmd as a child tracked by r (killed with SIGKILL if
// this process dies first) and returns it with the first line it printed
// (its addresses, or "ready").
func StartChild(r *Reaper, cmd *exec.Cmd) (*Child, string, error) {
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, "", err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("starting %v: %w", cmd.Args, err)
	}
	r.Track(cmd.Process)
	c := &Child{Cmd: cmd, r: r, in: in, out: bufio.NewReader(outp)}
	first, err := c.out.ReadString('\n')
	if err != nil {
		c.Stop()
		return nil, "", fmt.Errorf("child %v: %w", cmd.Args[1:], err)
	}
	return c, strings.TrimSpace(first), nil
}

// Ask writes cmd as a line and returns the child's answer line.
func (c *Child) Ask(cmd string) (string, error) {
	if _, err := fmt.Fprintln(c.in, cmd); err != nil {
		return "", err
	}
	s, err := c.out.ReadString('\n')
	return strings.TrimSpace(s), err
}

// PID is the child's process id.
func (c *Child) PID() int { return c.Cmd.Process.Pid }

// Stop closes the child's stdin, kills it and reaps it.
func (c *Child) Stop() {
	c.in.Close()
	c.Cmd.Process.Kill()
	c.Cmd.Wait()
	c.r.Untrack(c.Cmd.Process)
}
