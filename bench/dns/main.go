// Command dns benchmarks the per-pod DNS proxy (dnsproxy) on loopback and
// prints, one `name value unit` per line:
//
//	dns_local_qps_ratio      queries/s answered from state ÷ queries/s of a
//	                         bare miekg/dns server returning a fixed answer
//	                         (same client load, same run, rounds alternated)
//	dns_forward_overhead_us  added latency per forwarded query: median
//	                         latency through the proxy minus median latency
//	                         querying the upstream directly
//
// plus the absolute figures behind them. State is a synthetic mesh of 10k
// workloads and 1k services; the client is a workload owning 127.0.0.1.
// Everything runs in the current network namespace; upstream sockets are not
// marked (no capture rules here). Runs in about 30 s.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/statetest"
)

func main() {
	clients := flag.Int("clients", 4, "concurrent client sockets for the throughput rounds")
	round := flag.Duration("round", 2*time.Second, "duration of one throughput round")
	rounds := flag.Int("rounds", 3, "throughput rounds per server (alternated)")
	latQueries := flag.Int("latency-queries", 2000, "sequential queries per latency block")
	latBlocks := flag.Int("latency-blocks", 5, "latency blocks per path (alternated)")
	flag.Parse()
	if err := run(*clients, *round, *rounds, *latQueries, *latBlocks); err != nil {
		fmt.Fprintln(os.Stderr, "bench/dns:", err)
		os.Exit(1)
	}
}

func run(clients int, round time.Duration, rounds, latQueries, latBlocks int) error {
	bare, err := startFixed()
	if err != nil {
		return err
	}
	defer bare.Shutdown()
	upstream, err := startFixed()
	if err != nil {
		return err
	}
	defer upstream.Shutdown()

	store, err := benchState()
	if err != nil {
		return err
	}
	fwd, err := dnsproxy.NewForwarder(dnsproxy.ForwarderConfig{
		Servers: []netip.AddrPort{udpAddr(upstream)}, NoMark: true,
	})
	if err != nil {
		return err
	}
	srv, err := dnsproxy.New(dnsproxy.Config{
		ListenAddrs: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")},
		MaxInflight: 1024,
	}, dnsproxy.Deps{Store: store, Forwarder: fwd})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx)
	defer srv.Close()
	proxy := srv.Addrs()[0]

	local := pack("svc-7.ns-7.svc.cluster.local.", dns.TypeA)
	forwarded := pack("www.example.org.", dns.TypeA)
	// Check the paths before measuring them.
	if n, err := answers(proxy, local); err != nil || n != 1 {
		return fmt.Errorf("local query through the proxy: %d answers, %v", n, err)
	}
	if n, err := answers(proxy, forwarded); err != nil || n != 1 {
		return fmt.Errorf("forwarded query through the proxy: %d answers, %v", n, err)
	}

	// Throughput: alternate rounds so drift hits both servers alike.
	var bareQ, proxyQ int64
	for i := 0; i < rounds; i++ {
		n, err := load(udpAddr(bare), local, clients, round)
		if err != nil {
			return fmt.Errorf("bare server: %w", err)
		}
		bareQ += n
		n, err = load(proxy, local, clients, round)
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		proxyQ += n
	}
	secs := (time.Duration(rounds) * round).Seconds()

	// Latency: sequential queries, alternating blocks.
	var direct, via []time.Duration
	for i := 0; i < latBlocks; i++ {
		d, err := latency(udpAddr(upstream), forwarded, latQueries)
		if err != nil {
			return fmt.Errorf("upstream directly: %w", err)
		}
		direct = append(direct, d...)
		d, err = latency(proxy, forwarded, latQueries)
		if err != nil {
			return fmt.Errorf("through the proxy: %w", err)
		}
		via = append(via, d...)
	}
	mDirect, mVia := median(direct), median(via)

	fmt.Printf("dns_local_qps_ratio %.3f ratio\n", float64(proxyQ)/float64(bareQ))
	fmt.Printf("dns_local_qps %.0f qps\n", float64(proxyQ)/secs)
	fmt.Printf("dns_bare_qps %.0f qps\n", float64(bareQ)/secs)
	fmt.Printf("dns_forward_overhead_us %.1f us\n", float64(mVia-mDirect)/float64(time.Microsecond))
	fmt.Printf("dns_forward_latency_us %.1f us\n", float64(mVia)/float64(time.Microsecond))
	fmt.Printf("dns_direct_latency_us %.1f us\n", float64(mDirect)/float64(time.Microsecond))
	return nil
}

// benchState is a synthetic mesh plus the client workload on 127.0.0.1.
func benchState() (*state.Store, error) {
	cfg := statetest.Config{Workloads: 10_000, Services: 1_000, Namespaces: 100, Nodes: 100}
	mesh := statetest.Mesh(cfg)
	mesh["Kubernetes//Pod/ns-7/bench-client"] = &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: "Kubernetes//Pod/ns-7/bench-client", Name: "bench-client", Namespace: "ns-7",
		Addresses: [][]byte{{127, 0, 0, 1}}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
		CanonicalName: "bench-client", CanonicalRevision: "v1",
	}}}
	st := state.NewStore()
	if err := st.ApplyAddresses(mesh, nil); err != nil {
		return nil, err
	}
	return st, nil
}

// startFixed runs a bare miekg/dns UDP server on 127.0.0.1 that answers
// every query with one fixed A record.
func startFixed() (*dns.Server, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
			A: net.IPv4(192, 0, 2, 1)}}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	return srv, nil
}

func udpAddr(s *dns.Server) netip.AddrPort { return s.PacketConn.LocalAddr().(*net.UDPAddr).AddrPort() }

func pack(name string, qtype uint16) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

func answers(addr netip.AddrPort, q []byte) (int, error) {
	c, err := net.Dial("udp", addr.String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(q); err != nil {
		return 0, err
	}
	b := make([]byte, 2048)
	n, err := c.Read(b)
	if err != nil {
		return 0, err
	}
	var m dns.Msg
	if err := m.Unpack(b[:n]); err != nil {
		return 0, err
	}
	return len(m.Answer), nil
}

// load runs clients closed-loop senders (one query outstanding each) for d
// and returns the number of answers received.
func load(addr netip.AddrPort, q []byte, clients int, d time.Duration) (int64, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	deadline := time.Now().Add(d)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(id uint16) {
			defer wg.Done()
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			msg := append([]byte(nil), q...)
			buf := make([]byte, 2048)
			var n int64
			for seq := uint16(0); time.Now().Before(deadline); seq++ {
				binary.BigEndian.PutUint16(msg, id<<12|seq&0x0fff)
				if _, err := c.Write(msg); err != nil {
					errs <- err
					return
				}
				// A lost datagram would stall the loop: resend after a while.
				c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				for {
					m, err := c.Read(buf)
					if err != nil {
						break
					}
					if m >= 2 && buf[0] == msg[0] && buf[1] == msg[1] {
						n++
						break
					}
				}
			}
			total.Add(n)
		}(uint16(i))
	}
	wg.Wait()
	close(errs)
	return total.Load(), <-errs
}

// latency sends n queries one after another and returns each round trip.
func latency(addr netip.AddrPort, q []byte, n int) ([]time.Duration, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	msg := append([]byte(nil), q...)
	buf := make([]byte, 2048)
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint16(msg, uint16(i))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		for {
			m, err := c.Read(buf)
			if err != nil {
				return nil, err
			}
			if m >= 2 && buf[0] == msg[0] && buf[1] == msg[1] {
				break
			}
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
