package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/proxy/route"

	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// errDenied is returned by check when policy would deny the connection, so
// the exit status tells scripts.
var errDenied = errors.New("connection would be denied")

// findSource finds the source workload by uid, "namespace/name" or IP.
func findSource(snap *state.Snapshot, d *dump, ref string) (*state.Workload, error) {
	if w := snap.WorkloadByUID(ref); w != nil {
		return w, nil
	}
	if ip, err := netip.ParseAddr(ref); err == nil {
		if w := snap.WorkloadByIP("", ip); w != nil {
			return w, nil
		}
		return nil, fmt.Errorf("no workload has IP %s", ip)
	}
	ns, name, ok := strings.Cut(ref, "/")
	var found []*state.Workload
	for _, w := range d.Workloads {
		if ok && w.Namespace == ns && w.Name == name {
			found = append(found, snap.WorkloadByUID(w.UID))
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, fmt.Errorf("no workload %q (give a uid, namespace/name or IP)", ref)
	}
	return nil, fmt.Errorf("%d workloads are named %q; give the uid", len(found), ref)
}

// check explains how src's connection to dst would be routed by the source
// node proxy and whether the destination's L4 policies would allow it. The
// endpoint pick is one random draw, as for a real connection.
func check(w io.Writer, d *dump, srcRef string, dst netip.AddrPort) error {
	snap, err := d.snapshot()
	if err != nil {
		return err
	}
	policies, err := d.rbacPolicies()
	if err != nil {
		return err
	}
	src, err := findSource(snap, d, srcRef)
	if err != nil {
		return err
	}
	srcIP := netip.Addr{}
	if len(src.Addresses) > 0 {
		srcIP = src.Addresses[0]
	}
	fmt.Fprintf(w, "source:       %s/%s %s (%s) on %s\n", src.Namespace, src.Name, srcIP, src.Identity(), or(src.Node, "-"))
	r, err := route.Outbound(snap, src, dst)
	if err != nil {
		fmt.Fprintf(w, "route:        refused at the source: %v\n", err)
		return errDenied
	}
	if r.Service != nil {
		fmt.Fprintf(w, "destination:  %s is service %s\n", dst, r.Service.Key)
	}
	switch r.Kind {
	case route.Passthrough:
		fmt.Fprintf(w, "route:        passthrough: plain TCP to %s (not a mesh destination)\n", dst)
		fmt.Fprintln(w, "policy:       none (no node proxy authorizes it)")
		return nil
	case route.Direct:
		fmt.Fprintf(w, "route:        direct: plain TCP to %s (%s/%s does not use HBONE)\n", r.NextHop, r.DstWorkload.Namespace, r.DstWorkload.Name)
		fmt.Fprintln(w, "policy:       none (the destination is not captured by a node proxy)")
		return nil
	}
	via := ""
	if r.Waypoint {
		via = " via waypoint " + r.DstWorkload.Namespace + "/" + r.DstWorkload.Name
	}
	fmt.Fprintf(w, "route:        hbone%s: CONNECT %s to %s\n", via, r.Authority, r.NextHop)
	ids := r.UpstreamIdentities()
	idStrs := make([]string, len(ids))
	for i, id := range ids {
		idStrs[i] = id.String()
	}
	fmt.Fprintf(w, "peer must be: %s\n", strings.Join(idStrs, " or "))
	if r.Waypoint {
		fmt.Fprintln(w, "policy:       decided by the waypoint (L7) and by the destination's node proxy for the waypoint's connection; not evaluated here")
		return nil
	}
	dw := r.DstWorkload
	fmt.Fprintf(w, "destination:  %s/%s on %s\n", dw.Namespace, dw.Name, or(dw.Node, "-"))
	applying := policiesFor(policies, dw)
	conn := rbac.Conn{SrcIP: srcIP, DstIP: r.Authority.Addr(), DstPort: r.Authority.Port(), SrcIdentity: src.Identity()}
	dec := rbac.Evaluate(applying, conn)
	keys := make([]string, len(applying))
	for i, p := range applying {
		keys[i] = p.Key
	}
	fmt.Fprintf(w, "policies:     %s\n", or(strings.Join(keys, ", "), "none"))
	verdict := "ALLOW"
	if !dec.Allowed {
		verdict = "DENY"
	}
	by := ""
	if dec.Policy != "" {
		by = " by " + dec.Policy
	}
	fmt.Fprintf(w, "policy:       %s (%s%s)\n", verdict, dec.Reason, by)
	if dec.DryRunDeny != "" {
		fmt.Fprintf(w, "dry-run:      %s would deny\n", dec.DryRunDeny)
	}
	if !dec.Allowed {
		return errDenied
	}
	return nil
}
