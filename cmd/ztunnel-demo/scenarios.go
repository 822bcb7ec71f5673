package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/meshlab"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
)

func id(ns, sa string) string { return "spiffe://cluster.local/ns/" + ns + "/sa/" + sa }

func (d *demo) scenarios() []scenario {
	return []scenario{
		{"mTLS between client and server", d.mtls},
		{"denied by policy: intruder → server", d.denied},
		{"STRICT: plaintext from outside the mesh", d.strict},
		{"DNS for a ServiceEntry, then TCP to it", d.serviceEntry},
		{"through the waypoint: client → ratings", d.waypoint},
		{"L7 at the waypoint: denied + allowed path", d.l7},
		{"underlay carries only TLS to 15008", d.underlay},
	}
}

func (d *demo) pod(ns, name string) *testcluster.Pod { return d.m.Pod(ns, name) }

// echo sends n bytes of the marker pattern and checks they come back.
func echo(ctx context.Context, from *testcluster.Pod, dst netip.AddrPort, n int) error {
	want := bytes.Repeat([]byte(marker), n/len(marker)+1)[:n]
	got, err := meshlab.RoundTrip(ctx, from, dst, want)
	if err != nil {
		return fmt.Errorf("%s → %s: %w", from.Name, dst, err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s → %s: got %d of %d bytes back", from.Name, dst, len(got), n)
	}
	return nil
}

func (d *demo) mtls(ctx context.Context) (string, error) {
	client, server := d.pod("demo", "client"), d.pod("demo", "server")
	vip := netip.AddrPortFrom(d.m.Service("demo", "server"), 80)
	const n = 5000
	if err := echo(ctx, client, vip, n); err != nil {
		return "", err
	}
	// The server's node proxy logs the inbound side with both identities.
	in, err := d.m.WaitAccessLog(ctx, server.Node.Index, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && a.Str("src.workload") == "client" && a.Int("bytes_recv") == n
	})
	if err != nil {
		return "", err
	}
	src, dst := in.Str("src.identity"), in.Str("dst.identity")
	if src != id("demo", "client") || dst != id("demo", "server") {
		return "", fmt.Errorf("access log identities %q → %q", src, dst)
	}
	return fmt.Sprintf("%s → %s (%d bytes, via %s)", src, dst, n, vip), nil
}

// deniedBy waits for the inbound access-log line of a refused connection
// from src and returns its error text.
func (d *demo) deniedBy(ctx context.Context, node int, srcIP netip.Addr) (meshlab.AccessLog, error) {
	return d.m.WaitAccessLog(ctx, node, func(a meshlab.AccessLog) bool {
		return a.Str("direction") == "inbound" && strings.HasPrefix(a.Str("src.addr"), srcIP.String()+":") &&
			a.Str("reason") == "policy_denied"
	})
}

func policyName(errText string) string {
	if i := strings.LastIndex(errText, " by "); i >= 0 {
		return errText[i+4:]
	}
	return errText
}

func (d *demo) denied(ctx context.Context) (string, error) {
	intruder, server := d.pod("demo", "intruder"), d.pod("demo", "server")
	vip := netip.AddrPortFrom(d.m.Service("demo", "server"), 80)
	if err := echo(ctx, intruder, vip, 100); err == nil {
		return "", fmt.Errorf("intruder reached the server")
	}
	a, err := d.deniedBy(ctx, server.Node.Index, intruder.IP)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s refused, policy %s", a.Str("src.identity"), policyName(a.Str("error"))), nil
}

func (d *demo) strict(ctx context.Context) (string, error) {
	outsider, server := d.pod("legacy", "outsider"), d.pod("demo", "server")
	dst := netip.AddrPortFrom(server.IP, 8080)
	if err := echo(ctx, outsider, dst, 100); err == nil {
		return "", fmt.Errorf("plaintext reached the server")
	}
	a, err := d.deniedBy(ctx, server.Node.Index, outsider.IP)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("legacy/outsider → %s refused by %s", dst, policyName(a.Str("error"))), nil
}

func (d *demo) serviceEntry(ctx context.Context) (string, error) {
	client := d.pod("demo", "client")
	clusterDNS := netip.AddrPortFrom(d.m.DNSPod.IP, 53)
	r, err := meshlab.DNSQuery(ctx, client, "udp", clusterDNS, "api.legacy.example", dns.TypeA)
	if err != nil {
		return "", err
	}
	ip, err := meshlab.FirstA(r)
	if err != nil {
		return "", err
	}
	if !netip.MustParsePrefix("240.240.0.0/16").Contains(ip) {
		return "", fmt.Errorf("api.legacy.example is %s, not an auto-allocated 240.240/16 address", ip)
	}
	// A name the mesh does not own is forwarded to the cluster DNS server.
	fr, err := meshlab.DNSQuery(ctx, client, "udp", clusterDNS, "upstream.example", dns.TypeA)
	if err != nil {
		return "", err
	}
	up, err := meshlab.FirstA(fr)
	if err != nil {
		return "", fmt.Errorf("forwarded name: %w", err)
	}
	if err := echo(ctx, client, netip.AddrPortFrom(ip, 80), 1000); err != nil {
		return "", err
	}
	if _, err := d.m.WaitAccessLog(ctx, client.Node.Index, meshlab.Fields(map[string]string{
		"direction": "outbound", "dst.service": "api.legacy.example", "dst.workload": "legacy-api",
	})); err != nil {
		return "", err
	}
	return fmt.Sprintf("api.legacy.example = %s (answered by the node proxy; upstream.example = %s forwarded), echo via legacy/legacy-api", ip, up), nil
}

func (d *demo) waypoint(ctx context.Context) (string, error) {
	client := d.pod("demo", "client")
	vip := netip.AddrPortFrom(d.m.Service("demo", "ratings"), 80)
	if err := echo(ctx, client, vip, 2000); err != nil {
		return "", err
	}
	seen, err := d.wp.WaitAccessLog(ctx, meshlab.Fields(map[string]string{
		"dst.addr": vip.String(), "src.identity": id("demo", "client"), "code": "200",
	}))
	if err != nil {
		return "", fmt.Errorf("the waypoint logged no accepted CONNECT %s from the client: %w", vip, err)
	}
	ratings := d.pod("demo", "ratings")
	if _, err := d.m.WaitAccessLog(ctx, ratings.Node.Index, meshlab.Fields(map[string]string{
		"direction": "inbound", "dst.workload": "ratings", "src.identity": id("demo", "waypoint"),
	})); err != nil {
		return "", err
	}
	return fmt.Sprintf("waypoint got CONNECT %s (%s) from %s, sent %s", seen.Str("dst.addr"), seen.Str("protocol"), seen.Str("src.identity"), seen.Str("upstream")), nil
}

func (d *demo) underlay(ctx context.Context) (string, error) {
	client, server := d.pod("demo", "client"), d.pod("demo", "server")
	capture, err := d.m.CaptureUnderlay(ctx, "tcp and host "+server.IP.String())
	if err != nil {
		return "", err
	}
	const n = 1 << 20
	echoErr := echo(ctx, client, netip.AddrPortFrom(d.m.Service("demo", "server"), 80), n)
	pkts, err := capture.Stop()
	if echoErr != nil {
		return "", echoErr
	}
	if err != nil {
		return "", err
	}
	data := 0
	for _, p := range pkts {
		if p.Src.Port() != 15008 && p.Dst.Port() != 15008 {
			return "", fmt.Errorf("TCP outside HBONE on the underlay: %s → %s", p.Src, p.Dst)
		}
		if bytes.Contains(p.Payload, []byte(marker)) {
			return "", fmt.Errorf("the payload crossed the underlay in clear: %s → %s", p.Src, p.Dst)
		}
		if len(p.Payload) > 0 {
			data++
		}
	}
	if data == 0 {
		return "", fmt.Errorf("no HBONE data packets captured")
	}
	return fmt.Sprintf("%d packets to/from %s, all port 15008, %d with data, no cleartext marker in 1 MiB each way", len(pkts), server.IP, data), nil
}

func printKeep(m *meshlab.Mesh) {
	client := m.Pod("demo", "client")
	n0 := m.Node(0)
	fmt.Printf(`
KEEP=1: the mesh stays up until you press Ctrl-C here.
  a command in a pod:        ip netns exec %s ip addr
  node proxy config dump:    ip netns exec %s curl -s localhost:15000/config_dump
  node proxy metrics:        ip netns exec %s curl -s %s:%d/metrics
  YAML the mesh reads:       %s  (add files under user/ to change policy)
  process logs:              %s
  teardown from elsewhere:   go run ./cmd/ztunnel-demo --teardown
`, client.NetNSName(), n0.NetNSName(), n0.NetNSName(), n0.UnderlayIP, meshlab.ProxyStatsPort,
		m.ConfigRoot(), filepath.Join(m.StateDir(), "logs"))
}

// doTeardown removes the namespaces of a demo that was kept or crashed:
// processes inside them first, then the namespaces, then their resolv.conf.
func doTeardown() int {
	prefix := "zt-" + programName + "-"
	n, err := meshlab.Teardown(prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("removed %d network namespaces named %s*\n", n, prefix)
	return 0
}
