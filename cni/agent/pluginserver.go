package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// maxEventBody bounds a plugin request body.
const maxEventBody = 64 << 10

// PluginServer serves the chained plugin's events (plugin.PathAdd,
// plugin.PathLog) over HTTP on a unix socket.
type PluginServer struct {
	ln  net.Listener
	srv *http.Server
}

// ListenPlugin creates the socket (replacing a stale one, creating its
// directory) for a's plugin events.
func ListenPlugin(path string, a *Agent, log *zap.Logger) (*PluginServer, error) {
	if err := ensureDir(path); err != nil {
		return nil, fmt.Errorf("agent: plugin socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("agent: plugin socket %s: exists and is not a socket", path)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("agent: plugin socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+plugin.PathAdd, a.handleAdd)
	mux.HandleFunc("POST "+plugin.PathNetns, a.handleNetns)
	mux.HandleFunc("POST "+plugin.PathLog, a.handleLog)
	return &PluginServer{ln: ln, srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          zap.NewStdLog(log.Named("plugin-server")),
	}}, nil
}

// Close closes the socket of a server that never served.
func (s *PluginServer) Close() error { return s.ln.Close() }

// Serve serves until ctx is done, then closes the socket and returns nil.
func (s *PluginServer) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.srv.Shutdown(sctx)
	})
	defer stop()
	if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("agent: plugin server: %w", err)
	}
	return nil
}

// handleAdd enrolls the pod of a CNI ADD. 200 with an AddResponse means the
// pod is captured (or not ambient after all); 503 asks the runtime to retry
// (pod unknown yet, no proxy: the rules stay in place, fail closed); 400 is
// a bad request or bad capture annotations; 500 means rules failed.
func (a *Agent) handleAdd(w http.ResponseWriter, r *http.Request) {
	var req plugin.AddRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxEventBody)).Decode(&req); err != nil {
		http.Error(w, "agent: bad CNI ADD event: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), addTimeout)
	defer cancel()
	captured, err := a.CNIAdd(ctx, req)
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrPending), errors.Is(err, ErrPodUnknown), errors.Is(err, context.DeadlineExceeded):
			code = http.StatusServiceUnavailable
		case errors.Is(err, ErrBadSettings):
			code = http.StatusBadRequest
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(plugin.AddResponse{Captured: captured})
}

// CNIAdd handles one CNI ADD event: it looks the pod up (waiting briefly
// for the source), re-checks enrollment, and captures the pod in the netns
// the runtime named. It reports whether the pod was captured.
func (a *Agent) CNIAdd(ctx context.Context, req plugin.AddRequest) (bool, error) {
	log := a.log.With(zap.String("pod", req.PodNamespace+"/"+req.PodName), zap.String("uid", req.PodUID))
	if req.PodName == "" || req.PodNamespace == "" || req.Netns == "" {
		return false, fmt.Errorf("%w: CNI ADD event without pod name, namespace or netns", ErrBadSettings)
	}
	pod, ambient, why, err := a.lookup(ctx, req)
	if err != nil {
		log.Warn("CNI ADD: pod not known yet; the runtime will retry", zap.Error(err))
		return false, err
	}
	if !ambient {
		a.learn(req.PodUID, req.Netns)
		log.Info("CNI ADD: pod is not ambient; not captured", zap.String("reason", why))
		return false, nil
	}
	var ips []netip.Addr
	for _, ip := range req.IPs {
		ips = append(ips, ip.Address.Addr())
	}
	if len(ips) == 0 {
		ips = podIPs(pod)
	}
	h, err := netns.Open(req.Netns)
	if err != nil {
		log.Error("CNI ADD: cannot open the pod's network namespace", zap.String("netns", req.Netns), zap.Error(err))
		return false, fmt.Errorf("%w: %w", ErrRules, err)
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := a.enroll(ctx, enrollReq{pod: pod, ips: ips, netnsPath: req.Netns, ns: h, via: viaCNI}); err != nil {
		return false, err
	}
	log.Info("CNI ADD: pod captured", zap.String("reason", why), zap.String("netns", req.Netns))
	return true, nil
}

// lookup finds the event's pod in the source, refreshing it and waiting up
// to lookupWait for it to appear (local mode writes the Pending pod just
// before CNI ADD runs).
func (a *Agent) lookup(ctx context.Context, req plugin.AddRequest) (*corev1.Pod, bool, string, error) {
	deadline := time.Now().Add(lookupWait)
	for {
		if a.cfg.Refresh != nil {
			if err := a.cfg.Refresh(); err != nil {
				a.log.Warn("refreshing the cluster source failed", zap.Error(err))
			}
		}
		objs, changed := a.cfg.Source.Current()
		if objs != nil {
			for _, p := range objs.Pods {
				if p.Namespace != req.PodNamespace || p.Name != req.PodName {
					continue
				}
				if req.PodUID != "" && string(p.UID) != req.PodUID {
					continue // an older pod of that name
				}
				ok, why := a.isAmbient(objs, p)
				return p, ok, why, nil
			}
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return nil, false, "", fmt.Errorf("%w: %s/%s (uid %q)", ErrPodUnknown, req.PodNamespace, req.PodName, req.PodUID)
		}
		t := time.NewTimer(min(wait, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false, "", fmt.Errorf("%w: %s/%s: %w", ErrPodUnknown, req.PodNamespace, req.PodName, ctx.Err())
		case <-changed:
			t.Stop()
		case <-t.C:
		}
	}
}

// handleNetns records the sandbox namespace of a pod the plugin did not
// hand over (plugin.PathNetns): the runtime's own answer to "which
// namespace is this pod's", used if the pod is enrolled later.
func (a *Agent) handleNetns(w http.ResponseWriter, r *http.Request) {
	var req plugin.AddRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxEventBody)).Decode(&req); err != nil {
		http.Error(w, "agent: bad netns event: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.PodUID == "" || req.Netns == "" {
		http.Error(w, "agent: netns event without pod UID or netns", http.StatusBadRequest)
		return
	}
	a.learn(req.PodUID, req.Netns)
	a.log.Debug("CNI ADD of a pod not captured: sandbox namespace recorded", zap.String("pod", req.PodNamespace+"/"+req.PodName),
		zap.String("uid", req.PodUID), zap.String("netns", req.Netns))
	w.WriteHeader(http.StatusNoContent)
}

// handleLog re-logs one plugin log line with the pod it is about.
func (a *Agent) handleLog(w http.ResponseWriter, r *http.Request) {
	var entry map[string]any
	if err := json.NewDecoder(io.LimitReader(r.Body, maxEventBody)).Decode(&entry); err != nil {
		http.Error(w, "agent: bad log entry: "+err.Error(), http.StatusBadRequest)
		return
	}
	str := func(k string) string {
		s, _ := entry[k].(string)
		delete(entry, k)
		return s
	}
	level, msg := str("level"), str("msg")
	fields := []zap.Field{zap.String("pod", str("namespace")+"/"+str("pod")), zap.String("plugin_time", str("time"))}
	delete(entry, "logger")
	for k, v := range entry {
		fields = append(fields, zap.Any(k, v))
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.InfoLevel
	}
	lvl = min(lvl, zapcore.ErrorLevel) // a plugin line never stops the agent
	if ce := a.log.Named("plugin").Check(lvl, msg); ce != nil {
		ce.Write(fields...)
	}
	w.WriteHeader(http.StatusNoContent)
}
