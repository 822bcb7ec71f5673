package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/bench/benchkit"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

// proxyPIDs are the two node proxies, by node.
func (b *bench) proxyPIDs() [2]int { return [2]int{b.m.Nodes[0].Proxy.PID(), b.m.Nodes[1].Proxy.PID()} }

// procCPU returns each process's CPU time (user + system) so far, in
// seconds, by node.
func procCPU(pids [2]int) ([2]float64, error) {
	var out [2]float64
	for i, pid := range pids {
		t, err := benchkit.CPU(pid)
		if err != nil {
			return out, fmt.Errorf("node%d pid %d CPU: %w", i, pid, err)
		}
		out[i] = t.Seconds()
	}
	return out, nil
}

// proxyMemory reports both proxies' resident memory and state size to
// stderr and returns the larger VmRSS in MiB.
func (b *bench) proxyMemory() (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var max float64
	for i, mn := range b.m.Nodes {
		st, err := benchkit.Status(mn.Proxy.PID())
		if err != nil {
			return 0, fmt.Errorf("node%d proxy memory: %w", i, err)
		}
		rss := float64(st["VmRSS"]) / 1024
		if rss > max {
			max = rss
		}
		// Before anything asks the proxy for a dump (the config dump and the
		// heap profile allocate).
		if b.memDir != "" {
			if err := b.dumpProc(i, b.memDir); err != nil {
				logf("memory of node%d: %v", i, err)
			}
		}
		workloads, services := stateSize(ctx, b.m, i)
		logf("node%d proxy: VmRSS %.1f MiB (anon %.1f, file %.1f), VmHWM %.1f MiB, threads %d; state: %d workloads, %d services; Go runtime: %s",
			i, rss, float64(st["RssAnon"])/1024, float64(st["RssFile"])/1024, float64(st["VmHWM"])/1024, st["Threads"],
			workloads, services, goMemStats(ctx, mn.Node))
		if b.memDir != "" {
			if err := b.dumpHeap(ctx, i, b.memDir); err != nil {
				logf("memory of node%d: %v", i, err)
			}
		}
		if b.profileDir != "" {
			path := filepath.Join(b.profileDir, fmt.Sprintf("heap-node%d.pprof", i))
			if err := fetch(ctx, mn.Node, "/debug/pprof/heap", path); err != nil {
				logf("heap profile node%d: %v", i, err)
			}
		}
	}
	return max, nil
}

// settleWait is how long settledMemory waits: longer than the node
// proxy's memory release interval (5 s, cmd/ztunnel).
const settleWait = 6 * time.Second

// settledMemory waits d without traffic and logs both proxies' VmRSS
// again: what mesh_proxy_rss_mb reads right after the last connections
// depends on whether the proxy's periodic release ran in between.
func (b *bench) settledMemory(d time.Duration) {
	time.Sleep(d)
	for i, mn := range b.m.Nodes {
		st, err := benchkit.Status(mn.Proxy.PID())
		if err != nil {
			logf("node%d proxy memory: %v", i, err)
			continue
		}
		logf("node%d proxy %v later: VmRSS %.1f MiB (anon %.1f, file %.1f)", i, d,
			float64(st["VmRSS"])/1024, float64(st["RssAnon"])/1024, float64(st["RssFile"])/1024)
		if b.memDir != "" {
			if err := b.dumpProc(i, filepath.Join(b.memDir, "settled")); err != nil {
				logf("memory of node%d: %v", i, err)
			}
		}
	}
}

// goMemStats summarises the runtime.MemStats lines of a proxy's heap
// profile (debug=1), in MiB.
func goMemStats(ctx context.Context, n *testcluster.Node) string {
	body, err := get(ctx, n, "/debug/pprof/heap?debug=1", 10*time.Second)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, line := range strings.Split(string(body), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "# "), " = ")
		if !ok {
			continue
		}
		switch k {
		case "Sys", "HeapInuse", "HeapIdle", "HeapReleased", "StackInuse", "MSpanInuse", "GCSys", "OtherSys":
			if n, err := strconv.ParseFloat(v, 64); err == nil {
				parts = append(parts, fmt.Sprintf("%s %.1f", k, n/(1<<20)))
			}
		}
	}
	return strings.Join(parts, ", ") + " MiB"
}

// runqWait returns the time each process's threads spent runnable but
// waiting for a CPU so far (the second field of /proc/<pid>/task/*/schedstat).
func runqWait(pids [2]int) [2]time.Duration {
	var out [2]time.Duration
	for i, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
		for _, t := range tasks {
			data, err := os.ReadFile(t)
			if err != nil {
				continue // the thread exited
			}
			if f := strings.Fields(string(data)); len(f) >= 2 {
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				out[i] += time.Duration(ns)
			}
		}
	}
	return out
}

// stateSize counts the workloads and services in node i's proxy
// /config_dump (-1 when it cannot be read).
func stateSize(ctx context.Context, m *meshlab.Mesh, i int) (workloads, services int) {
	body, err := m.ConfigDump(ctx, i)
	if err != nil {
		return -1, -1
	}
	var dump map[string]any
	if json.Unmarshal(body, &dump) != nil {
		return -1, -1
	}
	return count(dump["workloads"]), count(dump["services"])
}

func count(v any) int {
	switch v := v.(type) {
	case []any:
		return len(v)
	case map[string]any:
		return len(v)
	}
	return -1
}

// profileProxies starts a CPU profile of seconds on both node proxies
// (admin /debug/pprof/profile) and returns a function that waits for them
// and writes <profileDir>/<name>-node<i>.pprof.
func (b *bench) profileProxies(name string, seconds int) func() {
	var wg sync.WaitGroup
	for i, mn := range b.m.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(b.profileDir, fmt.Sprintf("%s-node%d.pprof", name, i))
			if err := fetchProfile(mn.Node, seconds, path); err != nil {
				logf("profile %s node%d: %v", name, i, err)
				return
			}
			logf("profile %s node%d: %s", name, i, path)
		}()
	}
	return wg.Wait
}

func fetchProfile(n *testcluster.Node, seconds int, path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(seconds+15)*time.Second)
	defer cancel()
	return fetch(ctx, n, fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds), path)
}

// get GETs path from node n's proxy admin endpoint (meshlab.NodeHTTP has a
// fixed 5 s timeout, too short for a CPU profile).
func get(ctx context.Context, n *testcluster.Node, path string, timeout time.Duration) ([]byte, error) {
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, "tcp", addr)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+meshlab.ProxyAdminAddr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: status %d", path, resp.StatusCode)
	}
	return body, err
}

// fetch writes what get returns into file out.
func fetch(ctx context.Context, n *testcluster.Node, path, out string) error {
	timeout := 30 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
	}
	body, err := get(ctx, n, path, timeout)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, body, 0o644)
}

// waitListening polls `ss` inside pod p until a TCP socket listens on
// port. (Dialling would not tell: a captured pod's node proxy accepts on
// the pod's behalf.)
func waitListening(ctx context.Context, p *testcluster.Pod, port int) error {
	return waitListen(ctx, p.NetNS, p.Namespace+"/"+p.Name, port, nil)
}

func runCmd(ctx context.Context, path string, args ...string) (string, error) {
	return runCmdEnv(ctx, nil, path, args...)
}

func runCmdEnv(ctx context.Context, env []string, path string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func loadAvg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
