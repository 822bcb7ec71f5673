package plugin

import "net/netip"

// The agent's HTTP API on its unix socket (Config.AgentSocket). The host part
// of the URL is irrelevant ("http://unix/cmdadd"); the agent routes on the
// path.
const (
	// DefaultAgentSocket is where the node agent serves plugin events.
	DefaultAgentSocket = "/var/run/ztunnel-cni/pluginevent.sock"
	// PathAdd receives a POST of AddRequest for every ambient pod's CNI
	// ADD. The agent answers 200 with an AddResponse once the pod is
	// captured and its proxy acked; anything else fails the ADD.
	PathAdd = "/cmdadd"
	// PathNetns receives a POST of AddRequest for the CNI ADD of a pod the
	// plugin did not hand over (not ambient): the agent remembers the
	// sandbox's network namespace by pod UID, the runtime's own record of
	// it, in case the pod is enrolled later by a relabel. Best effort, with
	// a short timeout: the pod's ADD never waits for, or fails on, it.
	PathNetns = "/netns"
	// PathLog receives a POST per plugin log line, the body one LogEntry.
	// Best effort: the plugin ignores the answer.
	PathLog = "/log"
)

// AddRequest is the body of POST PathAdd. Field names are Istio's
// (CNIPluginEvent), except Address, which is a CIDR string here.
type AddRequest struct {
	// Netns is the pod's network namespace path from CNI_NETNS, as the
	// container runtime sees it (the agent may need a host mount prefix).
	Netns        string
	PodName      string
	PodNamespace string
	// PodUID is K8S_POD_UID from CNI_ARGS; empty when the runtime does not
	// pass it.
	PodUID string
	// IPs are the pod's addresses from prevResult.
	IPs []PodIP
}

// PodIP is one address of prevResult.
type PodIP struct {
	// Interface is the name of the interface the address is on, from
	// prevResult's interfaces list; empty when prevResult does not say.
	Interface string
	// Address is the pod address with its prefix length, e.g.
	// "10.244.1.7/24" (host bits kept).
	Address netip.Prefix
	// Gateway is omitted when prevResult has none.
	Gateway netip.Addr `json:",omitzero"`
}

// AddResponse is the body of a 200 answer to POST PathAdd.
type AddResponse struct {
	// Captured is false when the agent decided the pod is not ambient after
	// all (it has fresher metadata); the ADD still succeeds.
	Captured bool `json:"captured"`
}

// LogEntry is the body of POST PathLog: one JSON log line of the plugin.
// Besides these keys it carries the line's structured fields (error, ...).
type LogEntry struct {
	Level     string `json:"level"`
	Time      string `json:"time"` // RFC 3339 with nanoseconds
	Msg       string `json:"msg"`
	Pod       string `json:"pod,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}
