package daemon

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// ReadyPath is where every daemon serves readiness (the path Istio's probes
// use).
const ReadyPath = "/healthz/ready"

// Task is one thing readiness waits for.
type Task struct {
	Name string
	// Ready reports whether the task is done; nil never is.
	Ready func() bool
}

// Closed is a Task.Ready that holds once ch is closed (nil never).
func Closed(ch <-chan struct{}) func() bool {
	return func() bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
}

// Readiness serves GET ReadyPath: 200 "ready\n" once every task is done,
// else 503 "not ready, pending: <names, sorted>". (Istio's ztunnel answers
// 500; every daemon here answers 503 Service Unavailable, which is what
// not-ready means to a load balancer, and Kubernetes counts any status
// outside 200-399 as a failed probe alike.)
//
// Below that first line the body lists the retry loops that are failing
// (see ShowRetries), so a probe's output says why a daemon is stuck.
type Readiness struct {
	mu      sync.Mutex
	tasks   []Task
	retries *backoff.Set
}

// NewReadiness returns a Readiness over tasks.
func NewReadiness(tasks ...Task) *Readiness {
	return &Readiness{tasks: slices.Clone(tasks)}
}

// Add adds tasks to wait for.
func (r *Readiness) Add(tasks ...Task) {
	r.mu.Lock()
	r.tasks = append(r.tasks, tasks...)
	r.mu.Unlock()
}

// ShowRetries lists the failing loops of s on the page.
func (r *Readiness) ShowRetries(s *backoff.Set) {
	r.mu.Lock()
	r.retries = s
	r.mu.Unlock()
}

// Pending returns the names of the tasks not done yet, sorted.
func (r *Readiness) Pending() []string {
	r.mu.Lock()
	tasks := r.tasks
	r.mu.Unlock()
	var p []string
	for _, t := range tasks {
		if t.Ready == nil || !t.Ready() {
			p = append(p, t.Name)
		}
	}
	slices.Sort(p)
	return p
}

func (r *Readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != ReadyPath {
		http.NotFound(w, req)
		return
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET")
		http.Error(w, "use GET", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if p := r.Pending(); len(p) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready, pending: %s", strings.Join(p, ", "))
	} else {
		fmt.Fprint(w, "ready\n")
	}
	r.mu.Lock()
	retries := r.retries
	r.mu.Unlock()
	for i, st := range retries.Failing() {
		if i == 0 {
			fmt.Fprint(w, "\nretrying:\n")
		}
		fmt.Fprintf(w, "  %s: %d failures since %s, next in %s: %s\n", st.Name, st.Failures,
			st.Since.UTC().Format(time.RFC3339), time.Until(st.NextRetry).Round(time.Millisecond), st.LastError)
	}
}
