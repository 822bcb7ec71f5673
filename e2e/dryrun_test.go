package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// dryRunDeny denies the client, first as a dry run (istio.io/dry-run), then
// enforced (the same policy without the annotation).
const dryRunDeny = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-client
  namespace: dryrun
  annotations: {istio.io/dry-run: "%v"}
spec:
  selector:
    matchLabels: {app: dr-server}
  action: DENY
  rules:
  - from:
    - source:
        principals: [cluster.local/ns/dryrun/sa/dr-client]
`

// TestDryRun: a dry-run DENY that selects a connection is evaluated by the
// server's node proxy, logged and counted as "would deny", and not
// enforced: the connection goes through. The same policy enforced refuses
// it, so the dry run really did select it.
func TestDryRun(t *testing.T) {
	roottest.Require(t)
	m, err := meshlab.Start(t, meshlab.Options{Name: "dryrun"})
	if err != nil {
		t.Fatal(err)
	}
	// After Start: building the binaries on a busy machine can take longer
	// than the whole test.
	ctx := ctxT(t, 90*time.Second)
	if err := m.AddNamespace("dryrun", ambientNS); err != nil {
		t.Fatal(err)
	}
	client, err := m.AddPod(ctx, 0, testcluster.PodSpec{Name: "dr-client", Namespace: "dryrun", ServiceAccount: "dr-client",
		Labels: map[string]string{"app": "dr-client"}})
	if err != nil {
		t.Fatal(err)
	}
	server, err := m.AddPod(ctx, 1, testcluster.PodSpec{Name: "dr-server", Namespace: "dryrun", ServiceAccount: "dr-server",
		Labels:     map[string]string{"app": "dr-server"},
		Containers: []kube.Container{{Name: "app", Ports: []kube.ContainerPort{{Name: "tcp-echo", Port: 8080}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.WaitForWorkloads(ctx, client.IP, server.IP); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(server.IP, 8080)
	node := server.Node.Index

	if err := m.Apply("e2e-dryrun-deny", fmt.Appendf(nil, dryRunDeny, true)); err != nil {
		t.Fatal(err)
	}
	if err := waitNodePolicy(ctx, m, node, "dryrun/deny-client", true); err != nil {
		t.Fatal(err)
	}
	got, err := meshlab.RoundTrip(ctx, client, dst, []byte("dry"))
	if err != nil || string(got) != "dry" {
		t.Fatalf("under the dry-run DENY: got %q, %v; want the echo (dry-run is never enforced)", got, err)
	}
	line, err := waitProxyLine(ctx, m, node, func(l map[string]any) bool {
		return l["msg"] == "proxy: dry-run policy evaluated, not enforced" && l["policy"] == "dryrun/deny-client"
	})
	if err != nil {
		t.Fatal(err)
	}
	if line["would"] != "deny" || line["enforced"] != "allow" || line["differs"] != true ||
		line["src_identity"] != spiffe("dryrun", "dr-client") {
		t.Errorf("dry-run log line %v; want would=deny enforced=allow differs=true from the client", line)
	}
	mfs, err := m.Metrics(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if n := meshlab.Counter(mfs, "ztunnel_dry_run_policy_decisions_total",
		map[string]string{"policy": "dryrun/deny-client", "decision": "deny"}); n < 1 {
		t.Errorf("ztunnel_dry_run_policy_decisions_total{policy=dryrun/deny-client,decision=deny} = %v, want >= 1", n)
	}
	if _, err := m.WaitAccessLog(ctx, node, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("dst.workload") == "dr-server" && a.Str("reason") == "" &&
			a.Int("bytes_recv") == 3
	}); err != nil {
		t.Errorf("no clean inbound access-log line for the dry-run connection: %v", err)
	}

	// Control: enforced, the same policy refuses the same connection.
	if err := m.Apply("e2e-dryrun-deny", fmt.Appendf(nil, dryRunDeny, false)); err != nil {
		t.Fatal(err)
	}
	if err := waitNodePolicy(ctx, m, node, "dryrun/deny-client", false); err != nil {
		t.Fatal(err)
	}
	if got, err := meshlab.RoundTrip(ctx, client, dst, []byte("enforced?")); err == nil && len(got) > 0 {
		t.Fatalf("enforced DENY answered %q", got)
	}
	if _, err := m.WaitAccessLog(ctx, node, func(a meshlab.AccessLog) bool {
		return a.Str("dst.workload") == "dr-server" && a.Str("reason") == "policy_denied" &&
			strings.HasSuffix(a.Str("error"), "denied by dryrun/deny-client")
	}); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("e2e-dryrun-deny"); err != nil {
		t.Fatal(err)
	}
}

// waitNodePolicy waits until node's proxy holds policy key with the given
// dry-run flag (its /config_dump lists policies with "key" and "dryRun").
func waitNodePolicy(ctx context.Context, m *meshlab.Mesh, node int, key string, dryRun bool) error {
	var last string
	for {
		body, err := m.ConfigDump(ctx, node)
		if err == nil {
			var dump struct {
				Policies []struct {
					Key    string `json:"key"`
					DryRun bool   `json:"dryRun"`
				} `json:"policies"`
			}
			if err = json.Unmarshal(body, &dump); err == nil {
				for _, p := range dump.Policies {
					if p.Key == key && p.DryRun == dryRun {
						return nil
					}
				}
				last = fmt.Sprintf("%+v", dump.Policies)
			}
		}
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node%d never held policy %s with dryRun=%v (last: %s): %w", node, key, dryRun, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitProxyLine waits until node's proxy has logged a JSON line match accepts.
func waitProxyLine(ctx context.Context, m *meshlab.Mesh, node int, match func(map[string]any) bool) (map[string]any, error) {
	for {
		sc := bufio.NewScanner(bytes.NewReader(m.Nodes[node].Proxy.Log()))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var l map[string]any
			if json.Unmarshal(sc.Bytes(), &l) == nil && match(l) {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no matching log line from node%d's proxy: %w", node, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
