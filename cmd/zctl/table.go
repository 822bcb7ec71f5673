package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/node/configdump"
)

// sectionNames are the sections zctl config-dump can print, in the order it
// prints them all ("all", or none named). The first four are istioctl
// ztunnel-config's, with its columns.
func sectionNames() []string {
	return []string{"workloads", "services", "policies", "certificates", "pods"}
}

// sectionOf maps what a user may type (istioctl's singular names, its
// "secret" for certificates) to a section name.
func sectionOf(s string) (string, bool) {
	switch strings.ToLower(s) {
	case "workload", "workloads", "wl":
		return "workloads", true
	case "service", "services", "svc":
		return "services", true
	case "policy", "policies", "authorization", "authorizationpolicies":
		return "policies", true
	case "certificate", "certificates", "certs", "secret", "secrets":
		return "certificates", true
	case "pod", "pods":
		return "pods", true
	}
	return "", false
}

// dumpFilter is config-dump's --namespace, --node and --address (istioctl's
// --workload-namespace / --service-namespace / --policy-namespace, --node
// and --address). Empty fields match everything.
type dumpFilter struct {
	namespace, node, address string
}

func (f dumpFilter) workloads(d *dump) []configdump.Workload {
	return slices.DeleteFunc(slices.Clone(d.Workloads), func(w configdump.Workload) bool {
		if f.namespace != "" && !strings.EqualFold(w.Namespace, f.namespace) || f.node != "" && !strings.EqualFold(w.Node, f.node) {
			return true
		}
		return f.address != "" && !slices.ContainsFunc(w.WorkloadIPs, func(a netip.Addr) bool { return a.String() == f.address })
	})
}

func (f dumpFilter) services(d *dump) []configdump.Service {
	return slices.DeleteFunc(slices.Clone(d.Services), func(s configdump.Service) bool {
		return f.namespace != "" && !strings.EqualFold(s.Namespace, f.namespace)
	})
}

func (f dumpFilter) policies(d *dump) []configdump.Policy {
	return slices.DeleteFunc(slices.Clone(d.Policies), func(p configdump.Policy) bool {
		return f.namespace != "" && !strings.EqualFold(p.Namespace, f.namespace)
	})
}

// render writes one section of d, filtered, as an aligned table.
func render(w io.Writer, d *dump, section string, f dumpFilter) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cols ...string) { fmt.Fprintln(tw, strings.Join(cols, "\t")) }
	switch section {
	case "workloads":
		row("NAMESPACE", "POD NAME", "ADDRESS", "NODE", "WAYPOINT", "PROTOCOL")
		wls := f.workloads(d)
		slices.SortFunc(wls, func(a, b configdump.Workload) int {
			return cmp.Or(cmp.Compare(a.Namespace+"."+a.Name, b.Namespace+"."+b.Name), cmp.Compare(a.Node, b.Node))
		})
		for _, wl := range wls {
			row(wl.Namespace, wl.Name, joinAddrs(wl.WorkloadIPs, wl.Hostname), or(wl.Node, "-"), waypointName(d, wl.Waypoint), wl.Protocol)
		}
	case "services":
		row("NAMESPACE", "SERVICE NAME", "SERVICE VIP", "WAYPOINT", "ENDPOINTS")
		svcs := f.services(d)
		slices.SortFunc(svcs, func(a, b configdump.Service) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Hostname, b.Hostname))
		})
		for _, s := range svcs {
			var vips []string
			for _, v := range s.VIPs {
				_, ip, _ := strings.Cut(v, "/")
				vips = append(vips, ip)
			}
			for _, v := range s.CIDRVIPs {
				_, p, _ := strings.Cut(v, "/")
				vips = append(vips, p)
			}
			// Healthy counts endpoints whose workload is in the dump and
			// healthy, as istioctl counts them.
			healthy := 0
			for uid := range s.Endpoints {
				if i := slices.IndexFunc(d.Workloads, func(w configdump.Workload) bool { return w.UID == uid }); i >= 0 && d.Workloads[i].Status == configdump.Healthy {
					healthy++
				}
			}
			row(s.Namespace, or(s.Name, s.Hostname), strings.Join(vips, ","), serviceWaypoints(d, &s), fmt.Sprintf("%d/%d", healthy, len(s.Endpoints)))
		}
	case "policies":
		row("NAMESPACE", "POLICY NAME", "ACTION", "SCOPE")
		pols := f.policies(d)
		slices.SortFunc(pols, func(a, b configdump.Policy) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
		for _, p := range pols {
			action := p.Action
			if p.DryRun {
				action += " (dry-run)"
			}
			row(p.Namespace, p.Name, action, p.Scope)
		}
	case "certificates":
		row("CERTIFICATE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE")
		for _, c := range d.Certificates {
			if len(c.CertChain) == 0 {
				row(c.Identity, "NA", c.State, "false", "NA", "NA", "NA")
				continue
			}
			for i, ci := range c.CertChain {
				kind := "Intermediate"
				if i == 0 {
					kind = "Leaf"
				}
				row(certRow(c.Identity, kind, c.State, ci)...)
			}
			for _, ci := range c.RootCerts {
				row(certRow(c.Identity, "Root", c.State, ci)...)
			}
		}
	case "pods":
		row("UID", "POD", "STATE", "NETNS", "SINCE", "ERROR")
		for _, uid := range slices.Sorted(maps.Keys(d.WorkloadState)) {
			p := d.WorkloadState[uid]
			row(uid, p.Info.Namespace+"/"+p.Info.Name, p.State, or(p.Netns, "-"), or(p.Since, "-"), or(p.LastError, "-"))
		}
		if d.PodProxies != nil {
			for _, p := range d.PodProxies.Draining {
				row(p.Info.UID, p.Info.Namespace+"/"+p.Info.Name, p.State, or(p.Netns, "-"), or(p.Since, "-"), "-")
			}
		}
	default:
		return fmt.Errorf("unknown section %q (want one of %s, or all)", section, strings.Join(sectionNames(), ", "))
	}
	return tw.Flush()
}

// certRow is one certificate line as istioctl prints it: the serial in hex,
// VALID CERT whether now is within its validity.
func certRow(identity, kind, status string, ci configdump.CertInfo) []string {
	serial := "NA"
	if n, ok := new(big.Int).SetString(ci.SerialNumber, 10); ok {
		serial = fmt.Sprintf("%x", n)
	}
	valid := false
	if from, err := time.Parse(time.RFC3339, ci.ValidFrom); err == nil {
		if until, err := time.Parse(time.RFC3339, ci.ExpirationTime); err == nil {
			now := time.Now()
			valid = !now.Before(from) && now.Before(until)
		}
	}
	return []string{identity, kind, status, fmt.Sprint(valid), serial, or(ci.ExpirationTime, "NA"), or(ci.ValidFrom, "NA")}
}

// serviceWaypoints is a service's waypoint, or its weighted (canary) set
// as name(weight) each, comma-separated, as the node proxy draws one.
func serviceWaypoints(d *dump, s *configdump.Service) string {
	if len(s.WeightedWaypoints) == 0 {
		return waypointName(d, s.Waypoint)
	}
	parts := make([]string, 0, len(s.WeightedWaypoints))
	for _, ww := range s.WeightedWaypoints {
		parts = append(parts, fmt.Sprintf("%s(%d)", waypointName(d, &ww.Destination), ww.Weight))
	}
	return strings.Join(parts, ",")
}

// waypointName is the waypoint's service name when the dump holds it,
// matched as istioctl does (namespace/hostname, or one of its VIPs), else
// the destination; "None" without one.
func waypointName(d *dump, g *configdump.GatewayAddress) string {
	if g == nil {
		return "None"
	}
	for _, s := range d.Services {
		if s.Key() == g.Destination || slices.Contains(s.VIPs, g.Destination) {
			return s.Name
		}
	}
	return g.Destination
}

// writeSections writes the sections as JSON or YAML: the node proxy's own
// objects, filtered; one section alone is its list, several an object keyed
// by section.
func writeSections(w io.Writer, d *dump, sections []string, f dumpFilter, format string) error {
	out := map[string]any{}
	for _, s := range sections {
		switch s {
		case "workloads":
			out[s] = f.workloads(d)
		case "services":
			out[s] = f.services(d)
		case "policies":
			out[s] = f.policies(d)
		case "certificates":
			out[s] = d.Certificates
		case "pods":
			out[s] = d.WorkloadState
		}
	}
	var v any = out
	if len(sections) == 1 {
		v = out[sections[0]]
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if format == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintln(w, strings.TrimRight(string(b), "\n"))
	return err
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
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
