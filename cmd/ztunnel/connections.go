package main

import (
	"github.com/ztunnel-go/ztunnel-go/internal/node/configdump"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// dumpConnections hands the open connections to the config dump's
// workloadState (configdump does not link the proxy).
func dumpConnections(cs []proxy.Connection) []configdump.Connection {
	out := make([]configdump.Connection, len(cs))
	for i, c := range cs {
		out[i] = configdump.Connection{
			Inbound: c.Direction == "inbound", Src: c.Src.Addr, Dst: c.Dst.Addr,
			OriginalDst: c.OriginalDst, HBONE: c.HBONEAddr, Service: c.Service, Tunnelled: c.HBONEAddr != "" || c.MTLS,
		}
	}
	return out
}
