package meshlab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// Ports of the waypoint process inside its pod's network namespace.
const (
	WaypointReadyPort   = 15021
	WaypointMetricsPort = 15020
	WaypointAdminAddr   = "127.0.0.1:15000"
)

// Waypoint is a running cmd/waypoint in a waypoint pod.
type Waypoint struct {
	Pod  *testcluster.Pod
	Proc *testcluster.Proc
	// Gateway is "namespace/name" of the Gateway it serves.
	Gateway string
}

// StartWaypoint runs cmd/waypoint in pod namespace/name for the Gateway of
// the same name (the pod's gateway.networking.k8s.io/gateway-name label
// when set), with the identity of the pod's service account and its
// node's token (as the test waypoint's node would vouch for it), and waits
// until it is ready (first xDS sync and certificate). It runs until the
// mesh is torn down.
func (m *Mesh) StartWaypoint(ctx context.Context, namespace, name string) (*Waypoint, error) {
	return m.StartWaypointArgs(ctx, namespace, name)
}

// StartWaypointArgs is StartWaypoint with more flags for cmd/waypoint (a
// bootstrap option such as --tracing-endpoint). Stop the waypoint (Close)
// before starting another in the same pod.
func (m *Mesh) StartWaypointArgs(ctx context.Context, namespace, name string, extra ...string) (*Waypoint, error) {
	p := m.Pod(namespace, name)
	if p == nil {
		return nil, fmt.Errorf("meshlab: waypoint pod %s/%s not found", namespace, name)
	}
	gw := name
	if v := p.Labels()["gateway.networking.k8s.io/gateway-name"]; v != "" {
		gw = v
	}
	sa := p.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	mn := m.Nodes[p.Node.Index]
	proc, err := p.Start(testcluster.Process{Name: "waypoint-" + namespace + "-" + name, Path: m.bin(BinWaypoint), Args: append([]string{
		"--gateway", namespace + "/" + gw,
		"--xds-address", m.CPAddr.String(),
		"--root-cert", m.RootCert,
		"--token", mn.TokenValue,
		"--trust-domain", m.opts.TrustDomain,
		"--service-account", sa,
		"--pod-name", name,
		"--node-name", mn.Name,
		"--ip", p.IP.String(),
		"--listen", "0.0.0.0:15008",
		"--metrics-addr", fmt.Sprintf("0.0.0.0:%d", WaypointMetricsPort),
		"--readiness-addr", fmt.Sprintf("0.0.0.0:%d", WaypointReadyPort),
		"--admin-addr", WaypointAdminAddr,
		"--log-level", m.opts.LogLevel,
	}, extra...)})
	if err != nil {
		return nil, err
	}
	w := &Waypoint{Pod: p, Proc: proc, Gateway: namespace + "/" + gw}
	m.mu.Lock()
	m.apps = append(m.apps, w)
	m.mu.Unlock()
	var last string
	for {
		code, body, err := w.HTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz/ready", WaypointReadyPort))
		if err == nil && code == http.StatusOK {
			return w, nil
		}
		last = fmt.Sprintf("%d %s %v", code, strings.TrimSpace(string(body)), err)
		select {
		case <-proc.Done():
			return nil, fmt.Errorf("%w: waypoint %s exited: %v", ErrNotReady, w.Gateway, proc.Err())
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: waypoint %s: %w (last answer: %s)", ErrNotReady, w.Gateway, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// HTTP GETs url from inside the waypoint pod (its admin, metrics and
// readiness servers).
func (w *Waypoint) HTTP(ctx context.Context, url string) (int, []byte, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return w.Pod.Dial(ctx, "tcp", addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("meshlab: GET %s in waypoint %s: %w", url, w.Gateway, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// Metrics returns the waypoint's Prometheus text.
func (w *Waypoint) Metrics(ctx context.Context) (string, error) {
	code, body, err := w.HTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", WaypointMetricsPort))
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("meshlab: waypoint metrics: status %d", code)
	}
	return string(body), err
}

// AccessLogs returns the waypoint's access-log lines ("request", one per
// HTTP request or TCP connection) so far.
func (w *Waypoint) AccessLogs() []AccessLog {
	var out []AccessLog
	sc := bufio.NewScanner(bytes.NewReader(w.Proc.Log()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"request"`)) {
			continue
		}
		var a AccessLog
		if json.Unmarshal(line, &a) == nil && a.Str("msg") == "request" {
			out = append(out, a)
		}
	}
	return out
}

// WaitAccessLog waits (polling) until the waypoint has logged a line for
// which match is true, and returns it.
func (w *Waypoint) WaitAccessLog(ctx context.Context, match func(AccessLog) bool) (AccessLog, error) {
	for {
		for _, a := range w.AccessLogs() {
			if match(a) {
				return a, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("meshlab: no matching access-log line from waypoint %s: %w", w.Gateway, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops the waypoint (SIGTERM: it drains).
func (w *Waypoint) Close() error { return w.Proc.Stop() }

// ServeHTTP serves h (HTTP/1.1 and h2c) on TCP port of pod p until the mesh
// is torn down: the HTTP application behind a waypoint.
func (m *Mesh) ServeHTTP(p *testcluster.Pod, port int, h http.Handler) error {
	ln, err := p.Listen(fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("meshlab: http on %s/%s:%d: %w", p.Namespace, p.Name, port, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	m.mu.Lock()
	m.apps = append(m.apps, srv)
	m.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return nil
}
