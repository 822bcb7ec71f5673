package daemon

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// Group is the one way a daemon runs goroutines: named tasks, started in
// the order Go is called and stopped in the reverse order, one at a time,
// so that what starts first (admin servers, the control-plane link) outlives
// what depends on it (listeners draining their connections).
//
// A task is a service by default: when it returns before the group stops,
// with or without an error, the group stops. The first error stops the
// group, is logged once with the task's name, and is what Wait returns. A
// task started with Once may finish with nil and leave the others running.
//
// Readiness holds once Wait is called, which says every task is started, and
// while every task is ready: running, not stopping, and passing its
// ReadyWhen condition if it has one. Until Wait, "startup" is pending, so a
// readiness server started before the tasks it reports on never answers
// ready too early. A task that failed or
// finished early is therefore never ready, and neither is a stopping
// daemon, so a load balancer stops sending it work while it drains.
type Group struct {
	log      *zap.Logger
	base     context.Context // values only; never cancelled
	ready    *Readiness
	stopping chan struct{}
	stopOnce sync.Once
	started  chan struct{} // closed by Wait
	startOne sync.Once

	mu       sync.Mutex
	tasks    []*groupTask
	err      error
	waitOnce sync.Once
	watched  chan struct{} // closed when the parent watcher has returned
}

type groupTask struct {
	name   string
	once   bool
	ready  func() bool
	stop   func()
	cancel context.CancelFunc
	done   chan struct{}
	// asked is set before OnStop runs, so that a task returning from its
	// graceful stop counts as stopped, not as ended early.
	asked atomic.Bool
	state taskState // guarded by Group.mu
}

type taskState int

const (
	taskRunning taskState = iota
	taskFinished
	taskFailed
)

// TaskOption changes how Go runs a task.
type TaskOption func(*groupTask)

// Once marks a task that finishes: a nil return leaves the group running
// and the task counts as ready from then on.
func Once() TaskOption { return func(t *groupTask) { t.once = true } }

// ReadyWhen adds cond to the task's readiness (the first xDS sync, the
// first certificate).
func ReadyWhen(cond func() bool) TaskOption { return func(t *groupTask) { t.ready = cond } }

// OnStop gives the task a graceful stop, called when the group reaches the
// task in its shutdown order and before the task's context is cancelled: a
// listener's drain, a server's Shutdown. It must return within its own
// bound; the task's context is cancelled after it returns.
func OnStop(stop func()) TaskOption { return func(t *groupTask) { t.stop = stop } }

// NewGroup returns a Group that stops when parent is done (the daemon's
// signal context). Its tasks' contexts carry parent's values but are
// cancelled only by the group, in its shutdown order. Wait must be called.
func NewGroup(parent context.Context, log *zap.Logger) *Group {
	g := &Group{
		log: log, base: context.WithoutCancel(parent), ready: NewReadiness(),
		stopping: make(chan struct{}), watched: make(chan struct{}), started: make(chan struct{}),
	}
	g.ready.Add(Task{Name: "startup", Ready: Closed(g.started)})
	// The one goroutine that is not a task: it turns the parent's end into
	// a stop, and leaves when the group stops for another reason.
	go func() {
		defer close(g.watched)
		select {
		case <-parent.Done():
			g.Stop()
		case <-g.stopping:
		}
	}()
	return g
}

// Readiness is the group's readiness page: one entry per task, plus any
// added with Readiness.Add.
func (g *Group) Readiness() *Readiness { return g.ready }

// Go starts run as the task name and reports whether it did. run must
// return once ctx is done. A task added after the group began stopping is
// not started, so what it would have closed is the caller's to close.
func (g *Group) Go(name string, run func(ctx context.Context) error, opts ...TaskOption) bool {
	t := &groupTask{name: name, done: make(chan struct{})}
	for _, o := range opts {
		o(t)
	}
	ctx, cancel := context.WithCancel(g.base)
	t.cancel = cancel
	g.mu.Lock()
	select {
	case <-g.stopping:
		g.mu.Unlock()
		cancel()
		close(t.done)
		return false
	default:
	}
	g.tasks = append(g.tasks, t)
	g.mu.Unlock()
	g.ready.Add(Task{Name: name, Ready: func() bool { return g.taskReady(t) }})
	go g.run(ctx, t, run)
	return true
}

func (g *Group) run(ctx context.Context, t *groupTask, run func(context.Context) error) {
	defer close(t.done)
	err := run(ctx)
	stopped := ctx.Err() != nil || t.asked.Load() // the group asked it to stop
	if stopped && errors.Is(err, context.Canceled) {
		err = nil
	}
	g.mu.Lock()
	switch {
	case err != nil:
		t.state = taskFailed
	default:
		t.state = taskFinished
	}
	first := err != nil && g.err == nil
	if first {
		g.err = &TaskError{Task: t.name, Err: err}
	}
	g.mu.Unlock()
	// A group running inside a task (an agent's Run in its daemon's group)
	// logged its failure already: log each failure once.
	var inner *TaskError
	logged := errors.As(err, &inner)
	switch {
	case first && !logged:
		g.log.Error("task failed; stopping", zap.String("task", t.name), zap.Error(err))
	case first:
		g.log.Info("task failed; stopping", zap.String("task", t.name))
	case err != nil && !logged:
		g.log.Warn("task failed while stopping", zap.String("task", t.name), zap.Error(err))
	}
	if err != nil || (!t.once && !stopped) {
		if err == nil {
			g.log.Info("task ended; stopping", zap.String("task", t.name))
		}
		g.Stop()
	}
}

func (g *Group) taskReady(t *groupTask) bool {
	select {
	case <-g.stopping:
		return false
	default:
	}
	g.mu.Lock()
	state := t.state
	g.mu.Unlock()
	switch {
	case state == taskFailed, state == taskFinished && !t.once:
		return false
	}
	return t.ready == nil || t.ready()
}

// TaskError is the first failure of a Group's task, as Wait returns it.
type TaskError struct {
	Task string
	Err  error
}

func (e *TaskError) Error() string { return e.Task + ": " + e.Err.Error() }
func (e *TaskError) Unwrap() error { return e.Err }

// Stop begins the shutdown; Wait carries it out. It is safe to call more
// than once and from any goroutine (an admin /quitquitquit).
func (g *Group) Stop() {
	g.stopOnce.Do(func() {
		g.mu.Lock()
		close(g.stopping)
		g.mu.Unlock()
	})
}

// Stopping is closed once the group begins to stop.
func (g *Group) Stopping() <-chan struct{} { return g.stopping }

// Wait blocks until the group stops, stops its tasks in the reverse order
// of Go (each one's OnStop, then its context, then waiting for it to
// return), and returns the first task error, prefixed with its name.
func (g *Group) Wait() error {
	g.startOne.Do(func() { close(g.started) })
	<-g.stopping
	g.waitOnce.Do(func() {
		g.mu.Lock()
		tasks := g.tasks
		g.mu.Unlock()
		for i := len(tasks) - 1; i >= 0; i-- {
			t := tasks[i]
			select {
			case <-t.done:
			default:
				g.log.Debug("stopping task", zap.String("task", t.name))
				t.asked.Store(true)
				if t.stop != nil {
					t.stop()
				}
			}
			t.cancel()
			<-t.done
		}
		<-g.watched
	})
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}
