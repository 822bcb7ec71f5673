package admin

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Readiness task names, as Istio's ztunnel reports them.
const (
	TaskStateManager         = "state manager"
	TaskWorkloadProxyManager = "workload proxy manager"
)

// Task is one thing readiness waits for: it is done once Done is closed.
type Task struct {
	Name string
	Done <-chan struct{}
}

// Readiness serves GET /healthz/ready: 200 "ready\n" once every task is
// done, else 500 "not ready, pending: <names, sorted>".
type Readiness struct {
	tasks []Task
}

// NewReadiness returns a Readiness over tasks (a task with a nil Done never
// completes).
func NewReadiness(tasks ...Task) *Readiness {
	return &Readiness{tasks: slices.Clone(tasks)}
}

// Pending returns the names of the tasks not done yet, sorted.
func (r *Readiness) Pending() []string {
	var p []string
	for _, t := range r.tasks {
		select {
		case <-t.Done:
		default:
			p = append(p, t.Name)
		}
	}
	slices.Sort(p)
	return p
}

func (r *Readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/healthz/ready" {
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
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "not ready, pending: %s", strings.Join(p, ", "))
		return
	}
	fmt.Fprint(w, "ready\n")
}
