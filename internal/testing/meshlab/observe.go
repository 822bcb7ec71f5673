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
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	dto "github.com/prometheus/client_model/go"
)

// NodeHTTP GETs url from inside node i's namespace (the host must be an IP
// literal) and returns the status code and body.
func (m *Mesh) NodeHTTP(ctx context.Context, node int, url string) (int, []byte, error) {
	n := m.Nodes[node]
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		// Plain text: a gzip answer costs the proxy a fresh ~0.7 MiB
		// compressor whenever a collection has emptied promhttp's pool,
		// and the benchmarks read the metrics every second while they
		// measure the proxy's memory (a Prometheus scrape comes every
		// 15 s or more).
		DisableCompression: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, "tcp", addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("meshlab: GET %s on %s: %w", url, n.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// ConfigDump returns node i's proxy /config_dump (JSON).
func (m *Mesh) ConfigDump(ctx context.Context, node int) ([]byte, error) {
	code, body, err := m.NodeHTTP(ctx, node, "http://"+ProxyAdminAddr+"/config_dump")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("meshlab: config_dump on node%d: status %d", node, code)
	}
	return body, err
}

// WaitForWorkloads waits until every node proxy's state holds a workload
// with each of ips (so traffic to and from them routes from every node).
func (m *Mesh) WaitForWorkloads(ctx context.Context, ips ...netip.Addr) error {
	if len(ips) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i := range m.Nodes {
		for {
			missing, err := m.missingWorkloads(ctx, i, ips)
			if err == nil && len(missing) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w: node%d proxy state lacks workloads %v (%v): %w", ErrNotReady, i, missing, err, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func (m *Mesh) missingWorkloads(ctx context.Context, node int, ips []netip.Addr) ([]netip.Addr, error) {
	body, err := m.ConfigDump(ctx, node)
	if err != nil {
		return ips, err
	}
	var dump struct {
		Workloads json.RawMessage `json:"workloads"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		return ips, fmt.Errorf("meshlab: config_dump: %w", err)
	}
	var missing []netip.Addr
	for _, ip := range ips {
		if !bytes.Contains(dump.Workloads, []byte(`"`+ip.String()+`"`)) {
			missing = append(missing, ip)
		}
	}
	return missing, nil
}

// Metrics scrapes node i's proxy /metrics.
func (m *Mesh) Metrics(ctx context.Context, node int) (map[string]*dto.MetricFamily, error) {
	code, body, err := m.NodeHTTP(ctx, node, fmt.Sprintf("http://%s:%d/metrics", m.Nodes[node].UnderlayIP, ProxyStatsPort))
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("meshlab: metrics on node%d: status %d", node, code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(body))
}

// Counter sums the samples of counter family name in mfs whose labels
// include all of want.
func Counter(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	sum := 0.0
	mf := mfs[name]
	if mf == nil {
		return 0
	}
	for _, s := range mf.GetMetric() {
		n := 0
		for _, l := range s.GetLabel() {
			if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
				n++
			}
		}
		if n == len(want) {
			sum += s.GetCounter().GetValue()
		}
	}
	return sum
}

// AccessLog is one access-log line of a node proxy ("connection complete",
// ): the JSON fields as logged.
type AccessLog map[string]any

// Str returns field k as a string ("" when absent).
func (a AccessLog) Str(k string) string {
	v, ok := a[k]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// Int returns numeric field k (0 when absent).
func (a AccessLog) Int(k string) int64 {
	if f, ok := a[k].(float64); ok {
		return int64(f)
	}
	return 0
}

// AccessLogs returns node i's proxy access-log lines so far.
func (m *Mesh) AccessLogs(node int) []AccessLog {
	var out []AccessLog
	sc := bufio.NewScanner(bytes.NewReader(m.Nodes[node].Proxy.Log()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(`"connection complete"`)) {
			continue
		}
		var a AccessLog
		if json.Unmarshal(line, &a) == nil && a.Str("msg") == "connection complete" {
			out = append(out, a)
		}
	}
	return out
}

// WaitAccessLog waits (polling) until node i's proxy has logged a line for
// which match is true, and returns it.
func (m *Mesh) WaitAccessLog(ctx context.Context, node int, match func(AccessLog) bool) (AccessLog, error) {
	for {
		for _, a := range m.AccessLogs(node) {
			if match(a) {
				return a, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("meshlab: no matching access-log line on node%d: %w", node, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Fields is a match function for WaitAccessLog: every key has the value.
func Fields(want map[string]string) func(AccessLog) bool {
	return func(a AccessLog) bool {
		for k, v := range want {
			if a.Str(k) != v {
				return false
			}
		}
		return true
	}
}

// RoundTrip connects from pod-like ns (a *testcluster.Pod) to dst as its
// application would, sends payload, half-closes and returns what came back.
func RoundTrip(ctx context.Context, from interface {
	Dial(context.Context, string, string) (net.Conn, error)
}, dst netip.AddrPort, payload []byte) ([]byte, error) {
	c, err := from.Dial(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		return got, err
	}
	return got, <-werr
}

// ShortErr is the last part of a wrapped error message, for one-line
// reports.
func ShortErr(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i > 0 {
		return s[i+2:]
	}
	return s
}
