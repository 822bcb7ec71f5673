package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// DNS capture finding codes.
const (
	codeStaleRules   = "ZTG0013" // a pod's capture rules predate the agent's current settings
	codeDNSCaptureSE = "ZTG0014" // DNS capture off for a pod that can use ServiceEntries needing it
)

// agentPod is one entry of a node agent's GET /pods (cni/agent.PodStatus):
// the capture rules in force in the pod.
type agentPod struct {
	UID        string            `json:"uid"`
	Namespace  string            `json:"namespace"`
	Name       string            `json:"name"`
	State      string            `json:"state"`
	DNSCapture bool              `json:"dnsCapture"`
	Settings   rules.PodSettings `json:"settings"`
	UpToDate   *bool             `json:"upToDate"`
	Error      string            `json:"error"`
	from       string            // where it was read
}

// loadAgentPods reads each node agent's /pods (admin address or saved file).
func loadAgentPods(admins, files []string) ([]agentPod, error) {
	var out []agentPod
	add := func(from string, b []byte) error {
		var ps []agentPod
		if err := json.Unmarshal(b, &ps); err != nil {
			return fmt.Errorf("decoding the node agent's /pods from %s: %w", from, err)
		}
		for i := range ps {
			ps[i].from = from
		}
		out = append(out, ps...)
		return nil
	}
	for _, a := range admins {
		b, url, err := adminRequest(http.MethodGet, a, "/pods", "is the node agent's admin reachable, and is --agent-admin right?")
		if err != nil {
			return nil, err
		}
		if err := add("admin "+url, b); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := add("file "+f, b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dnsNeeds lists, for a pod in namespace ns, the ServiceEntries it can use
// that only work with its DNS captured: a host with an auto-allocated
// address (only the node proxy's DNS proxy answers it) or a ServiceEntry
// bound to an egress waypoint (reached by that address).
func dnsNeeds(objs *cluster.Objects, ns string) []string {
	var out []string
	for _, se := range objs.ServiceEntries {
		if !exportedTo(se, ns) {
			continue
		}
		var why []string
		for _, h := range se.Spec.GetHosts() {
			if autoalloc.Eligible(se, h) {
				why = append(why, "auto-allocated address for "+h)
				break
			}
		}
		if wp := egressWaypoint(objs, se); wp != "" {
			why = append(why, "egress waypoint "+wp)
		}
		if len(why) > 0 {
			out = append(out, "ServiceEntry "+se.Namespace+"/"+se.Name+" ("+strings.Join(why, ", ")+")")
		}
	}
	sort.Strings(out)
	return out
}

// exportedTo reports whether se is visible in namespace ns (exportTo).
func exportedTo(se *networkingv1.ServiceEntry, ns string) bool {
	to := se.Spec.GetExportTo()
	if len(to) == 0 {
		return true
	}
	return slices.Contains(to, "*") || slices.Contains(to, ns) || se.Namespace == ns && slices.Contains(to, ".")
}

// egressWaypoint is the waypoint se is bound to (its istio.io/use-waypoint
// label, else its namespace's), "" for none.
func egressWaypoint(objs *cluster.Objects, se *networkingv1.ServiceEntry) string {
	labels := se.Labels
	if _, ok := labels[translate.LabelUseWaypoint]; !ok {
		if n := objs.Namespace(se.Namespace); n != nil {
			labels = n.Labels
		}
	}
	name := labels[translate.LabelUseWaypoint]
	if name == "" || name == "none" {
		return ""
	}
	return or(labels[translate.LabelUseWaypointNamespace], se.Namespace) + "/" + name
}

// dnsCaptureFindings: pods whose capture rules predate the agent's current
// settings (a DNS capture default change reaches running pods only when
// they restart), and pods with DNS capture off that can use ServiceEntries
// needing it (Istio 1.25's upgrade note: they break). pods is the node
// agents' view (the rules in force); without it, the pods' annotations are
// read with the agent's own parser, DNS capture assumed on by default (the
// default since Istio 1.25; the agent's actual default is only in /pods).
func dnsCaptureFindings(objs *cluster.Objects, pods []agentPod) []finding {
	var out []finding
	if pods != nil {
		for _, p := range pods {
			obj := "Pod " + p.Namespace + "/" + p.Name
			if p.UpToDate != nil && !*p.UpToDate {
				out = append(out, finding{Code: codeStaleRules, Level: levelWarning, Object: obj,
					Message: fmt.Sprintf("its capture rules (DNS capture %s) predate the node agent's current settings for it (a changed default or annotation); it keeps them until it restarts (%s)", onOff(p.DNSCapture), p.from),
					Fix:     "restart the pod (roll out its workload) to get the current rules"})
			}
			if p.State == "enabled" && !p.DNSCapture {
				if needs := dnsNeeds(objs, p.Namespace); len(needs) > 0 {
					out = append(out, dnsFinding(obj, "the rules in force, "+p.from, needs))
				}
			}
		}
		return out
	}
	for _, p := range objs.Pods {
		if !inAmbient(objs, p) {
			continue
		}
		s, err := rules.ParseAnnotations(p.Annotations, rules.PodSettings{DNSCapture: true})
		if err != nil || s.DNSCapture && !slices.Contains(s.ExcludeOutboundPorts, 53) {
			continue // a bad annotation fails the pod's capture: another problem
		}
		if needs := dnsNeeds(objs, p.Namespace); len(needs) > 0 {
			out = append(out, dnsFinding("Pod "+p.Namespace+"/"+p.Name, "its annotations", needs))
		}
	}
	return out
}

func dnsFinding(obj, from string, needs []string) finding {
	return finding{Code: codeDNSCaptureSE, Level: levelWarning, Object: obj,
		Message: "DNS capture is off (" + from + ") while it can use " + strings.Join(needs, "; ") +
			": its DNS answers come from upstream, which does not know these addresses, so its traffic to them bypasses the mesh or fails",
		Fix: "turn DNS capture on for it (annotation " + rules.AnnotationDNSCapture + "=true, or the agent's default) and restart it"}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
