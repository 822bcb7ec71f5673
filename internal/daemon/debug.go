package daemon

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// DebugHandlers adds what every daemon's Debug server carries to mux:
// /logging (GET, or POST without a level, shows the level; POST
// ?level=<lvl> sets it, POST ?reset restores the level the process started
// with) and the Go profiles under
// /debug/pprof/ (index, profile?seconds=N for CPU, trace?seconds=N for the
// runtime's execution trace (`go tool trace`), and every named
// profile; heap?gc=1 collects garbage first). Changing state takes POST, as
// in Istio's ztunnel and Envoy, so a browser cannot change it by following
// a link.
func DebugHandlers(mux *http.ServeMux, level zap.AtomicLevel) {
	mux.Handle("/logging", &logging{level: level, initial: level.Level()})
	mux.HandleFunc("GET /debug/pprof/", pprofIndex)
	mux.HandleFunc("GET /debug/pprof/profile", pprofCPU)
	mux.HandleFunc("GET /debug/pprof/trace", pprofTrace)
	mux.HandleFunc("GET /debug/pprof/{name}", pprofNamed)
}

type logging struct {
	level   zap.AtomicLevel
	initial zapcore.Level
}

func (l *logging) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if q.Has("level") || q.Has("reset") {
			w.Header().Set("Allow", "GET, POST")
			http.Error(w, "changing the log level takes POST", http.StatusMethodNotAllowed)
			return
		}
	case http.MethodPost:
		switch {
		case q.Has("reset"):
			l.level.SetLevel(l.initial)
		case q.Get("level") != "":
			lvl, err := ParseLevel(q.Get("level"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			l.level.SetLevel(lvl)
		default:
			// No level (istioctl ztunnel-config log sends "level="): only
			// read it, as Istio's ztunnel and Envoy answer.
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "use GET or POST", http.StatusMethodNotAllowed)
		return
	}
	fmt.Fprintf(w, "current log level is %s\n", l.level.Level())
}

func pprofIndex(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/debug/pprof/" {
		http.NotFound(w, r)
		return
	}
	var b strings.Builder
	b.WriteString("<html><body><h1>profiles</h1><ul>\n")
	b.WriteString(`<li><a href="profile?seconds=10">profile</a> (CPU, 10 s)</li>` + "\n")
	profiles := pprof.Profiles()
	sort.Slice(profiles, func(i, j int) bool { return profiles[i].Name() < profiles[j].Name() })
	for _, p := range profiles {
		n := html.EscapeString(p.Name())
		fmt.Fprintf(&b, "<li><a href=\"%s?debug=1\">%s</a> (%d)</li>\n", n, n, p.Count())
	}
	b.WriteString("</ul></body></html>\n")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprint(w, b.String())
}

func pprofNamed(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	p := pprof.Lookup(name)
	if p == nil {
		http.Error(w, fmt.Sprintf("unknown profile %q", name), http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	// heap?gc=1 collects first, as net/http/pprof does, so the profile and
	// its HeapAlloc line describe the live heap rather than whatever garbage
	// the last cycle left (a heap that has gone quiet may not collect again
	// for minutes).
	if gc, _ := strconv.Atoi(q.Get("gc")); gc > 0 && name == "heap" {
		runtime.GC()
	}
	debug, _ := strconv.Atoi(q.Get("debug"))
	if (name == "heap" || name == "allocs") && runtime.MemProfileRate == 0 {
		// An empty profile would read as "nothing allocated".
		if debug == 0 {
			http.Error(w, heapProfileOff, http.StatusConflict)
			return
		}
		w.Header().Set("X-Heap-Profile", heapProfileOff)
	}
	if debug > 0 {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
	}
	_ = p.WriteTo(w, debug)
}

// heapProfileOff answers a heap profile request while the sampling is off
// (HeapProfileOff); the debug=1 text still carries the runtime's MemStats.
const heapProfileOff = "heap profiling is off: start the process with GODEBUG=memprofilerate=524288 (Go's default rate) to sample the heap"

// pprofCPU records a CPU profile for ?seconds= (default 10, at most 300).
func pprofCPU(w http.ResponseWriter, r *http.Request) {
	record(w, r, 10, "profile", pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// pprofTrace writes the runtime's execution trace for ?seconds= (default
// 1): what each goroutine waited on and for how long, which a CPU profile
// cannot show (a request's latency on a mostly idle proxy is waiting).
func pprofTrace(w http.ResponseWriter, r *http.Request) {
	record(w, r, 1, "trace", trace.Start, trace.Stop)
}

// record streams what start writes for ?seconds= (def when absent, at most
// 300) as an attachment named name; a recording already running (start's
// error) is refused with 409.
func record(w http.ResponseWriter, r *http.Request, def int, name string, start func(io.Writer) error, stop func()) {
	secs, err := strconv.Atoi(r.URL.Query().Get("seconds"))
	if err != nil || secs <= 0 {
		secs = def
	}
	secs = min(secs, 300)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	if err := start(w); err != nil {
		w.Header().Del("Content-Disposition")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		http.Error(w, name+": "+err.Error(), http.StatusConflict)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(secs)*time.Second)
	defer cancel()
	<-ctx.Done()
	stop()
}
