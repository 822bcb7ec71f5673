package main

import (
	"fmt"
	"strings"
)

// verifyPaths checks the node proxies' access logs: the mesh pair went
// through HBONE on both nodes, the captured client reached the outside
// address by plain passthrough, and the direct pair never touched a proxy.
// Figures from a run where this fails would compare the wrong paths.
func (b *bench) verifyPaths() error {
	meshSrc := b.meshClient.IP.String() + ":"
	var hboneOut, hboneIn, pass int
	for node := range b.m.Nodes {
		for _, a := range b.m.AccessLogs(node) {
			src, dst := a.Str("src.addr"), a.Str("dst.addr")
			for _, direct := range []string{b.directClient.IP.String(), b.directServer.IP.String()} {
				if strings.HasPrefix(src, direct+":") || strings.HasPrefix(dst, direct+":") {
					return fmt.Errorf("node%d proxy logged a connection of the direct pair: %v", node, a)
				}
			}
			switch {
			case node == 0 && a.Str("direction") == "outbound" && strings.HasPrefix(src, meshSrc) &&
				strings.HasPrefix(dst, b.meshServer.IP.String()+":") && a.Str("dst.hbone_addr") != "":
				hboneOut++
			case node == 1 && a.Str("direction") == "inbound" && strings.HasPrefix(src, meshSrc) && a.Str("src.identity") != "":
				hboneIn++
			case node == 0 && a.Str("direction") == "outbound" && strings.HasPrefix(dst, outsideIP+":") && a.Str("dst.hbone_addr") == "":
				pass++
			}
		}
	}
	logf("access logs: %d HBONE outbound (node0), %d HBONE inbound (node1), %d passthrough (node0)", hboneOut, hboneIn, pass)
	if (b.want("iperf") || b.want("latency")) && (hboneOut == 0 || hboneIn == 0) {
		return fmt.Errorf("the mesh pair's traffic did not go through HBONE on both proxies (%d out, %d in)", hboneOut, hboneIn)
	}
	if (b.want("iperf") || b.want("connect")) && pass == 0 {
		return fmt.Errorf("no passthrough connection to %s in node0's access log", outsideIP)
	}
	return nil
}
