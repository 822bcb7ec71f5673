package daemon

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
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
type Readiness struct {
	tasks []Task
}

// NewReadiness returns a Readiness over tasks.
func NewReadiness(tasks ...Task) *Readiness {
	return &Readiness{tasks: slices.Clone(tasks)}
}

// Pending returns the names of the tasks not done yet, sorted.
func (r *Readiness) Pending() []string {
	var p []string
	for _, t := range r.tasks {
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
		return
	}
	fmt.Fprint(w, "ready\n")
}
