package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// syncStatus mirrors the control plane's /debug/syncz (bootstrap.SyncStatus
// of xds.StreamStatus; a test checks the two agree), so zctl does not link
// the xDS server.
type syncStatus struct {
	ControlPlane string         `json:"controlPlane,omitempty"` // set by zctl: what it read
	Streams      []streamStatus `json:"streams"`
}

type streamStatus struct {
	Stream    int64        `json:"stream"`
	Kind      string       `json:"kind"`
	NodeID    string       `json:"nodeId"`
	Peer      string       `json:"peer"`
	Pod       string       `json:"pod"`
	Node      string       `json:"node"`
	Version   string       `json:"version"`
	Connected time.Time    `json:"connected"`
	Types     []typeStatus `json:"types"`
}

type typeStatus struct {
	TypeURL   string    `json:"typeUrl"`
	Sync      string    `json:"sync"`
	Wildcard  bool      `json:"wildcard"`
	Names     int       `json:"names"`
	Held      int       `json:"held"`
	LastSent  string    `json:"lastSentNonce,omitempty"`
	SentAt    time.Time `json:"sentAt,omitzero"`
	LastAcked string    `json:"lastAckedNonce,omitempty"`
	AckedAt   time.Time `json:"ackedAt,omitzero"`
	NACK      string    `json:"nack,omitempty"`
}

const statusAbout = `Lists each node proxy and waypoint connected to the control plane (its
/debug/syncz): pod, node, version, and per subscribed type the last nonce sent
and acknowledged and SYNCED (last response acked), STALE (a newer response is
unacked or was rejected: the NACK message is shown) or NOT SENT.`

func runStatus(args []string, out io.Writer) error {
	var addr, file, format string
	s := newSub("status", "", statusAbout, out)
	s.source("cp-admin", defaultCPAdmin, "the control plane's (ztunnel-cp --admin)", &addr, &file)
	s.format(&format)
	pos, err := s.parse(args, &format)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		s.fs.Usage()
		return fmt.Errorf("status takes no arguments, got %q", pos)
	}
	var st syncStatus
	from, err := readSource(addr, file, "/debug/syncz", "is ztunnel-cp running, and is --cp-admin right?", &st)
	if err != nil {
		return err
	}
	st.ControlPlane = from
	return writeData(out, format, st, func() error { return statusTable(out, st, time.Now()) })
}

// shortType is the last element of a type URL ("Address", "Authorization").
func shortType(url string) string {
	if i := strings.LastIndexAny(url, "./"); i >= 0 {
		return url[i+1:]
	}
	return url
}

func statusTable(w io.Writer, st syncStatus, now time.Time) error {
	fmt.Fprintf(w, "# control plane: %s (%d streams)\n", st.ControlPlane, len(st.Streams))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tNODE\tVERSION\tAGE\tTYPE\tSTATUS\tSENT\tACKED\tRESOURCES\tNACK")
	for _, s := range st.Streams {
		name := or(s.Pod, or(s.NodeID, s.Peer))
		if len(s.Types) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t-\n", name, s.Kind, or(s.Node, "-"), or(s.Version, "-"), age(now, s.Connected))
		}
		for i, t := range s.Types {
			lead := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", name, s.Kind, or(s.Node, "-"), or(s.Version, "-"), age(now, s.Connected))
			if i > 0 {
				lead = "\t\t\t\t"
			}
			res := fmt.Sprint(t.Held)
			if !t.Wildcard {
				res += fmt.Sprintf(" (%d named)", t.Names)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", lead, shortType(t.TypeURL), t.Sync, or(t.LastSent, "-"),
				or(t.LastAcked, "-"), res, or(t.NACK, "-"))
		}
	}
	return tw.Flush()
}
