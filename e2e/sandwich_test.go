package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	pt "github.com/ztunnel-go/ztunnel-go/internal/testing/proxytest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// TestSandwichProxyProtocol: a sandwiched waypoint (a captured pod whose
// workload has application_tunnel PROXY/15088, as istiod sets from the
// Gateway's ambient.istio.io/waypoint-inbound-binding) gets, from its own
// node proxy, a PROXY v2 header on loopback naming the original client and
// its verified identity (TLV 0xD0) before the payload.
//
//	node0: client (sa client)                 captured
//	node1: wp (sa wp), the sandwiched waypoint captured; its app listens on
//	       127.0.0.1:15088 and parses PROXY v2
//
// Service reviews 10.96.7.1 (9080→8080) uses wp as its waypoint.
func TestSandwichProxyProtocol(t *testing.T) {
	m := newMeshEnv(t)
	n0, n1 := m.c.Node(0), m.c.Node(1)
	client := m.addPod(n0, "client", "client", true)
	wp := m.addPod(n1, "wp", "wp", true)

	vip := netip.MustParseAddr("10.96.7.1")
	tunnel := func(w *workloadapi.Workload) {
		w.ApplicationTunnel = &workloadapi.ApplicationTunnel{Protocol: workloadapi.ApplicationTunnel_PROXY, Port: 15088}
	}
	pt.Apply(t, m.store,
		pt.Pod("apps", "client", client.IP.String(), pt.OnNode(n0.Name), pt.ServiceAccount("client")),
		pt.Pod("apps", "wp", wp.IP.String(), pt.OnNode(n1.Name), pt.ServiceAccount("wp"),
			pt.InService(pt.ServiceKey("apps", "wp"), 15008, 15008), tunnel),
		pt.Service("apps", "wp", "10.96.7.2", []uint32{15008, 15008}),
		pt.Service("apps", "reviews", vip.String(), []uint32{9080, 8080}, pt.ServiceWaypoint(pt.WaypointHost("apps", "wp"))),
	)

	// The waypoint's listener: loopback only, as upstream binds app
	// tunnels, so nothing reaches it without its node proxy.
	ln, err := wp.Listen("127.0.0.1:15088")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go acceptLoop(ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		h, err := readProxyV2(br)
		if err != nil {
			fmt.Fprintf(c, "bad PROXY header: %v\n", err)
			return
		}
		fmt.Fprintf(c, "from=%s src=%s dst=%s id=%s\n", c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(), h.src, h.dst, h.tlvs[0xD0])
		io.Copy(c, br)
		c.(*net.TCPConn).CloseWrite()
	})
	clientID := meshID("apps", "client").String()

	t.Run("service VIP through the client's node proxy", func(t *testing.T) {
		msg := []byte("hello waypoint")
		out, err := roundTrip(t, client.Pod, netip.AddrPortFrom(vip, 9080), msg)
		if err != nil {
			t.Fatal(err)
		}
		line, rest, _ := bytes.Cut(out, []byte("\n"))
		h := parseHeaderLine(t, string(line))
		if h["from"] != "127.0.0.1" {
			t.Errorf("the tunnel came from %s, want loopback", h["from"])
		}
		if src, err := netip.ParseAddrPort(h["src"]); err != nil || src.Addr() != client.IP || src.Port() == 0 {
			t.Errorf("PROXY source %q, want the client %s with its port", h["src"], client.IP)
		}
		if h["dst"] != netip.AddrPortFrom(vip, 9080).String() || h["id"] != clientID {
			t.Errorf("PROXY dst %q id %q, want %s:9080 and %s", h["dst"], h["id"], vip, clientID)
		}
		if !bytes.Equal(rest, msg) {
			t.Errorf("payload after the header %q, want %q", rest, msg)
		}
		// The waypoint's node proxy records the connection once both sides
		// have closed, which may be just after the client saw EOF.
		testkit.Eventually(t, waitTimeout, "the inbound access-log line at the waypoint's node proxy", func() bool {
			for _, l := range m.accessLines(map[string]string{"direction": "inbound",
				"dst.workload": "wp", "dst.hbone_addr": netip.AddrPortFrom(vip, 9080).String()}) {
				if _, failed := l["reason"]; !failed {
					return true
				}
			}
			return false
		})
	})

	// A CONNECT naming the service by hostname (Istio 1.26): PROXY cannot
	// carry names, so the header names the service's VIP and port.
	t.Run("hostname authority", func(t *testing.T) {
		h, err := client.Handle()
		if err != nil {
			t.Fatal(err)
		}
		cc, err := hbone.Dial(ctxT(t, 10*time.Second), &hbone.ClientConfig{
			Certs: m.certs,
			Dial: func(ctx context.Context, _ netip.Addr, hop netip.AddrPort) (net.Conn, error) {
				// Marked as the node proxy's own, so the client pod's
				// capture lets it out.
				return h.Dial(ctx, "tcp", hop, netns.SockOpts{Mark: rules.ZtunnelMark})
			},
		}, hbone.Key{Src: meshID("apps", "client"), Dst: []identity.Identity{wp.id}, SrcIP: client.IP,
			NextHop: netip.AddrPortFrom(wp.IP, 15008)})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		tun, err := cc.Connect(ctxT(t, 10*time.Second), &hbone.ConnectRequest{
			Host: pt.Hostname("apps", "reviews"), Authority: netip.AddrPortFrom(netip.Addr{}, 9080)})
		if err != nil {
			t.Fatal(err)
		}
		defer tun.Close()
		tun.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(tun).ReadString('\n')
		if err != nil {
			t.Fatalf("read the waypoint's answer: %v", err)
		}
		hdr := parseHeaderLine(t, strings.TrimSpace(line))
		if src, err := netip.ParseAddrPort(hdr["src"]); err != nil || src.Addr() != client.IP {
			t.Errorf("PROXY source %q, want the client %s", hdr["src"], client.IP)
		}
		if hdr["dst"] != netip.AddrPortFrom(vip, 9080).String() || hdr["id"] != clientID {
			t.Errorf("PROXY dst %q id %q, want %s:9080 and %s", hdr["dst"], hdr["id"], vip, clientID)
		}

		// A hostname the waypoint does not serve is refused, not guessed.
		_, err = cc.Connect(ctxT(t, 10*time.Second), &hbone.ConnectRequest{
			Host: pt.Hostname("apps", "ratings"), Authority: netip.AddrPortFrom(netip.Addr{}, 9080)})
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code != 503 {
			t.Fatalf("unknown hostname: %v, want status 503", err)
		}
	})
}

// parseHeaderLine splits the test waypoint's "k=v k=v" answer.
func parseHeaderLine(t *testing.T, line string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("waypoint answered %q", line)
		}
		out[k] = v
	}
	return out
}

// proxyV2 is a parsed PROXY protocol v2 header.
type proxyV2 struct {
	src, dst netip.AddrPort
	tlvs     map[byte]string
}

// readProxyV2 reads a PROXY v2 header (HAProxy's proxy-protocol.txt 2.2)
// as a server would: signature, version 2 command PROXY, TCP over IPv4 or
// IPv6, addresses, then TLVs to the declared length. Written from the spec,
// independently of the proxy's encoder.
func readProxyV2(r io.Reader) (*proxyV2, error) {
	var fixed [16]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, err
	}
	if !bytes.Equal(fixed[:12], []byte("\r\n\r\n\x00\r\nQUIT\n")) {
		return nil, fmt.Errorf("signature % X", fixed[:12])
	}
	if fixed[12] != 0x21 {
		return nil, fmt.Errorf("version/command 0x%02X, want 0x21", fixed[12])
	}
	body := make([]byte, binary.BigEndian.Uint16(fixed[14:16]))
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	h := &proxyV2{tlvs: map[byte]string{}}
	var alen int
	switch fixed[13] {
	case 0x11:
		alen = 12
		if len(body) < alen {
			return nil, errors.New("short IPv4 block")
		}
		h.src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[0:4])), binary.BigEndian.Uint16(body[8:10]))
		h.dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(body[4:8])), binary.BigEndian.Uint16(body[10:12]))
	case 0x21:
		alen = 36
		if len(body) < alen {
			return nil, errors.New("short IPv6 block")
		}
		h.src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[0:16])), binary.BigEndian.Uint16(body[32:34]))
		h.dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(body[16:32])), binary.BigEndian.Uint16(body[34:36]))
	default:
		return nil, fmt.Errorf("family/protocol 0x%02X", fixed[13])
	}
	for rest := body[alen:]; len(rest) > 0; {
		if len(rest) < 3 {
			return nil, errors.New("truncated TLV")
		}
		n := int(binary.BigEndian.Uint16(rest[1:3]))
		if len(rest) < 3+n {
			return nil, errors.New("TLV longer than the header")
		}
		h.tlvs[rest[0]] = string(rest[3 : 3+n])
		rest = rest[3+n:]
	}
	return h, nil
}
