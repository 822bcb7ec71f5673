package main

import (
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"
)

// connections mirrors the node proxy's /connections (proxy.Connection; a
// test checks the two agree), so zctl does not link the proxy.
type connections struct {
	Proxy       string       `json:"proxy,omitempty"` // set by zctl: what it read
	Connections []connection `json:"connections"`
}

type connection struct {
	Direction     string    `json:"direction"`
	Start         time.Time `json:"start"`
	Src           connPeer  `json:"src"`
	Dst           connPeer  `json:"dst"`
	HBONEAddr     string    `json:"hboneAddr,omitempty"`
	OriginalDst   string    `json:"originalDst,omitempty"`
	Service       string    `json:"service,omitempty"`
	MTLS          bool      `json:"mtls"`
	BytesSent     int64     `json:"bytesSent"`
	BytesReceived int64     `json:"bytesReceived"`
}

type connPeer struct {
	Addr      string `json:"addr"`
	Workload  string `json:"workload,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Identity  string `json:"identity,omitempty"`
}

const connectionsAbout = `Lists the node proxy's open connections (its admin /connections): source and
destination with their workloads and identities (a source identity only when
mTLS proved it), the service, bytes so far and age. --workload keeps the
connections whose source or destination is that workload (namespace/name,
name or IP); --direction in|out keeps inbound or outbound ones.`

func runConnections(args []string, out io.Writer) error {
	var addr, file, format, workload, direction string
	s := newSub("connections", "", connectionsAbout, out)
	s.source("admin", defaultNodeAdmin, "the node proxy's (ztunnel ADMIN)", &addr, &file)
	s.format(&format)
	s.fs.StringVar(&workload, "workload", "", "only connections from or to this workload: namespace/name, name or IP")
	s.fs.StringVar(&direction, "direction", "", "only in(bound) or out(bound) connections")
	pos, err := s.parse(args, &format)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		s.fs.Usage()
		return fmt.Errorf("connections takes no arguments, got %q", pos)
	}
	switch direction {
	case "in":
		direction = "inbound"
	case "out":
		direction = "outbound"
	case "", "inbound", "outbound":
	default:
		return fmt.Errorf("unknown --direction %q (want in or out)", direction)
	}
	var cs connections
	from, err := readSource(addr, file, "/connections", "is the node proxy running, and is --admin right?", &cs)
	if err != nil {
		return err
	}
	cs.Proxy = from
	kept := cs.Connections[:0]
	for _, c := range cs.Connections {
		if (direction == "" || c.Direction == direction) && (workload == "" || c.Src.is(workload) || c.Dst.is(workload) ||
			hostOf(c.HBONEAddr) == workload) {
			kept = append(kept, c)
		}
	}
	cs.Connections = kept
	return writeData(out, format, cs, func() error { return connectionsTable(out, cs, time.Now()) })
}

// is says whether p is workload w: namespace/name, name or the address's IP.
func (p connPeer) is(w string) bool {
	if p.Workload != "" && (w == p.Workload || w == p.Namespace+"/"+p.Workload) {
		return true
	}
	return hostOf(p.Addr) == w
}

func hostOf(addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap.Addr().String()
	}
	return ""
}

func (p connPeer) String() string {
	if p.Workload == "" {
		return p.Addr
	}
	return p.Namespace + "/" + p.Workload + " " + p.Addr
}

func connectionsTable(w io.Writer, cs connections, now time.Time) error {
	fmt.Fprintf(w, "# node proxy: %s (%d open connections)\n", cs.Proxy, len(cs.Connections))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DIRECTION\tSOURCE\tSOURCE IDENTITY\tDESTINATION\tDESTINATION IDENTITY\tSERVICE\tPROTOCOL\tSENT\tRECEIVED\tAGE")
	for _, c := range cs.Connections {
		dst := c.Dst.String()
		if c.HBONEAddr != "" && c.HBONEAddr != c.Dst.Addr {
			dst += " (target " + c.HBONEAddr + ")"
		}
		proto := "TCP"
		if c.MTLS {
			proto = "HBONE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", c.Direction, c.Src, or(c.Src.Identity, "-"), dst,
			or(c.Dst.Identity, "-"), or(c.Service, "-"), proto, c.BytesSent, c.BytesReceived, age(now, c.Start))
	}
	return tw.Flush()
}
