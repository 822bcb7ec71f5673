package xdsserver

import (
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

// notifySink reports every address upsert on a shared channel.
type notifySink struct{ seen chan<- string }

func (s notifySink) ApplyAddresses(up map[string]*workloadapi.Address, _ []string) error {
	for name := range up {
		s.seen <- name
	}
	return nil
}

func (notifySink) ApplyAuthorizations(map[string]*securityapi.Authorization, []string) error {
	return nil
}

// BenchmarkPushToClients measures one changed workload, among 1000, reaching
// 100 clients in the same process (the shape of bench/xds).
func BenchmarkPushToClients(b *testing.B) {
	const clients, pods = 100, 1000
	srv := NewServer(ServerConfig{})
	set := make(map[string]proto.Message, pods)
	for i := range pods {
		set[fmt.Sprintf("pod-%d", i)] = workload(fmt.Sprintf("pod-%d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250))
	}
	srv.SetResources(xds.AddressType, set)
	srv.SetResources(xds.AuthorizationType, nil)
	gs := grpc.NewServer()
	srv.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	seen := make(chan string, clients*pods)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := make([]*xds.Client, clients)
	for i := range cs {
		c, err := xds.NewClient(xds.ClientConfig{Address: lis.Addr().String(), Insecure: true, Node: testNode, Sink: notifySink{seen}})
		if err != nil {
			b.Fatal(err)
		}
		cs[i] = c
		go func() { _ = c.Run(ctx) }()
	}
	for _, c := range cs {
		<-c.Synced()
	}
	for len(seen) > 0 {
		<-seen
	}

	b.ResetTimer()
	for i := range b.N {
		set["pod-7"] = workload("pod-7", fmt.Sprintf("10.2.%d.%d", (i/250)%250, i%250))
		srv.SetResources(xds.AddressType, set)
		for range clients {
			if name := <-seen; name != "pod-7" {
				b.Fatalf("client got %s, want only pod-7", name)
			}
		}
	}
}
