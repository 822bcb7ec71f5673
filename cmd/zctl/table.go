package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// sectionNames are the sections zctl config-dump can print, in the order it
// prints them all.
func sectionNames() []string {
	return []string{"workloads", "services", "policies", "certificates", "pods"}
}

// render writes one section of d as an aligned table.
func render(w io.Writer, d *dump, section string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cols ...string) { fmt.Fprintln(tw, strings.Join(cols, "\t")) }
	switch section {
	case "workloads":
		row("NAMESPACE", "NAME", "ADDRESSES", "NODE", "PROTOCOL", "IDENTITY", "HEALTHY", "WAYPOINT")
		for _, wl := range d.Workloads {
			id := "spiffe://" + or(wl.TrustDomain, "cluster.local") + "/ns/" + wl.Namespace + "/sa/" + or(wl.ServiceAccount, "default")
			row(wl.Namespace, wl.Name, joinAddrs(wl.Addresses, wl.Hostname), or(wl.Node, "-"), wl.Protocol, id,
				yesNo(wl.Healthy), gateway(wl.Waypoint))
		}
	case "services":
		row("NAMESPACE", "HOSTNAME", "VIPS", "PORTS", "ENDPOINTS", "WAYPOINT")
		for _, s := range d.Services {
			var vips, ports []string
			for _, v := range s.VIPs {
				vips = append(vips, v.Prefix.String())
			}
			for _, p := range s.Ports {
				t := "named"
				if p.TargetPort != 0 {
					t = fmt.Sprint(p.TargetPort)
				}
				ports = append(ports, fmt.Sprintf("%d→%s", p.ServicePort, t))
			}
			healthy, total := 0, 0
			for _, wl := range d.Workloads {
				if slices.ContainsFunc(wl.Services, func(sp state.ServicePorts) bool { return sp.Service == s.Key }) {
					total++
					if wl.Healthy {
						healthy++
					}
				}
			}
			row(s.Namespace, s.Hostname, or(strings.Join(vips, ","), "None"), or(strings.Join(ports, ","), "-"),
				fmt.Sprintf("%d/%d", healthy, total), gateway(s.Waypoint))
		}
	case "policies":
		row("NAMESPACE", "NAME", "SCOPE", "ACTION", "RULES", "DRY-RUN")
		for _, p := range d.Policies {
			row(p.Namespace, p.Name, p.Scope, p.Action, fmt.Sprint(len(p.Rules)), yesNo(p.DryRun))
		}
	case "certificates":
		row("IDENTITY", "STATE", "EXPIRES", "NEXT-REFRESH", "ERROR")
		for _, c := range d.Certificates {
			exp := "-"
			if len(c.CertChain) > 0 {
				exp = c.CertChain[0].ExpirationTime
			}
			row(c.Identity, c.State, exp, or(c.NextRefresh, "-"), or(c.LastError, "-"))
		}
	case "pods":
		row("UID", "POD", "STATE", "NETNS", "SINCE", "ERROR")
		if d.WorkloadState != nil {
			for _, uid := range slices.Sorted(maps.Keys(d.WorkloadState.Pods)) {
				p := d.WorkloadState.Pods[uid]
				row(uid, p.Info.Namespace+"/"+p.Info.Name, p.State, p.Netns, or(p.Since, "-"), or(p.LastError, "-"))
			}
			for _, p := range d.WorkloadState.Draining {
				row(p.Info.UID, p.Info.Namespace+"/"+p.Info.Name, p.State, p.Netns, or(p.Since, "-"), "-")
			}
		}
	default:
		return fmt.Errorf("unknown section %q (want one of %s)", section, strings.Join(sectionNames(), ", "))
	}
	return tw.Flush()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func joinAddrs[A fmt.Stringer](as []A, hostname string) string {
	if len(as) == 0 {
		return or(hostname, "-")
	}
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

func gateway(g *state.GatewayAddress) string {
	switch {
	case g == nil:
		return "-"
	case g.IsHostname():
		return g.Hostname.Namespace + "/" + g.Hostname.Hostname
	default:
		return g.Address.IP.String()
	}
}
