package main

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate/synth"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// nodeSink is one node proxy's state store; it reports each churned
// workload (canonical revision other than the initial r0) once it holds it.
type nodeSink struct {
	*state.Store
	out *lineWriter
}

func (s *nodeSink) ApplyAddresses(up map[string]*workloadapi.Address, rm []string) error {
	err := s.Store.ApplyAddresses(up, rm)
	now := time.Now().UnixNano()
	for uid, a := range up {
		if w := a.GetWorkload(); w != nil && w.GetCanonicalRevision() != "r0" && strings.HasPrefix(w.GetCanonicalRevision(), "r") {
			if held := s.Load().WorkloadByUID(uid); held != nil && held.CanonicalRevision == w.GetCanonicalRevision() {
				s.out.printf("seen %s@%s %d\n", uid, w.GetCanonicalRevision(), now)
			}
		}
	}
	return err
}

func (s *nodeSink) ApplyAuthorizations(up map[string]*securityapi.Authorization, rm []string) error {
	return s.Store.ApplyAuthorizations(up, rm)
}

type lineWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *lineWriter) printf(format string, args ...any) {
	l.mu.Lock()
	fmt.Fprintf(l.w, format, args...)
	l.w.Flush()
	l.mu.Unlock()
}

// runNodes runs the node clients until stdin closes: they connect in
// batches of ten (a fleet does not sync all at once either), and "ready" is
// printed once every client has synced.
func runNodes(addr, rootFile string, n int, o options) error {
	out := &lineWriter{w: bufio.NewWriter(os.Stdout)}
	pem, err := os.ReadFile(rootFile)
	if err != nil {
		out.printf("error %v\n", err)
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var names [][]string
	if o.subscribe == "node" {
		names = nodeNames(n, o.clients)
	}
	var clients []*xds.Client
	for i := 0; i < o.clients; i++ {
		var sub []string
		if names != nil {
			sub = names[i]
		}
		c, err := xds.NewClient(xds.ClientConfig{
			Address: addr, RootCAs: pool, ServerName: "istiod.istio-system.svc", Token: nodeToken(i),
			Node: xds.NodeInfo{
				PodName: fmt.Sprintf("ztunnel-%d", i), PodNamespace: "istio-system",
				InstanceIPs: []string{fmt.Sprintf("10.250.%d.%d", i/250, i%250+1)}, NodeName: fmt.Sprintf("node-%d", i),
			},
			Sink:         &nodeSink{Store: state.NewStore(), out: out},
			AddressNames: sub,
		})
		if err != nil {
			out.printf("error %v\n", err)
			return err
		}
		clients = append(clients, c)
		go c.Run(ctx)
		if i%10 == 9 || i == o.clients-1 {
			for _, c := range clients[i/10*10:] {
				select {
				case <-c.Synced():
				case <-time.After(5 * time.Minute):
					out.printf("error client did not sync within 5 minutes\n")
					return fmt.Errorf("client did not sync")
				}
			}
		}
	}
	fmt.Fprintf(os.Stderr, "%dk: node-client process RSS %d MB after the full syncs (%d clients, %s subscription, %d pods)\n",
		n/1000, procStatus("VmRSS")/1024, o.clients, o.subscribe, n)
	out.printf("ready\n")
	io.Copy(io.Discard, os.Stdin)
	return nil
}

// nodeNames are the Address names each node subscribes to: the workloads
// of the pods it runs and the Services they belong to.
func nodeNames(n, nodes int) [][]string {
	spec := synth.Default(n)
	out := make([][]string, nodes)
	seen := make([]map[string]bool, nodes)
	for j := 0; j < n; j++ {
		p := synth.Pod(spec, j, 0)
		node := j % spec.Nodes
		if node >= nodes {
			continue
		}
		if seen[node] == nil {
			seen[node] = map[string]bool{}
		}
		out[node] = append(out[node], "Kubernetes//Pod/"+p.Namespace+"/"+p.Name)
		svc := p.Namespace + "/" + p.Labels["app"] + "." + p.Namespace + ".svc.cluster.local"
		if !seen[node][svc] {
			seen[node][svc] = true
			out[node] = append(out[node], svc)
		}
	}
	return out
}
