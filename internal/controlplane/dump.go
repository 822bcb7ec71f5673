package controlplane

import (
	"sort"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// ConfigDump is what the control plane loaded and made of it, for an admin
// endpoint or `ztunnel-cp` debugging. Every field is a copy.
type ConfigDump struct {
	// Generation counts translations; 0 means none yet.
	Generation uint64 `json:"generation"`
	// Objects lists the loaded objects per kind as "namespace/name".
	Objects map[string][]string `json:"objects"`
	// SourceErrors are the source's problems (file, document, field).
	SourceErrors []string `json:"sourceErrors,omitempty"`
	// InvalidValues are the policy values that cannot be enforced, so fail
	// closed (PolicyStatus.Invalid); in local mode each names its file,
	// document and field like a SourceErrors line.
	InvalidValues []string `json:"invalidValues,omitempty"`
	// Warnings of the latest translation.
	Warnings []string `json:"warnings,omitempty"`
	// Ignored: one line per object of a kind the control plane does not
	// read (VirtualService, DestinationRule, Sidecar, ...), which therefore
	// has no effect. They are not listed in Objects.
	Ignored []string `json:"ignored,omitempty"`
	// Routes: the status.parents conditions of each HTTPRoute and GRPCRoute
	// with a mesh parent (what the leader writes into the objects).
	Routes []translate.RouteStatus `json:"routes,omitempty"`
	// Policies: what became of each AuthorizationPolicy and PeerAuthentication.
	Policies []translate.PolicyStatus `json:"policies,omitempty"`
	// Allocations are the ServiceEntry auto-allocated addresses.
	Allocations []autoalloc.Allocation `json:"allocations,omitempty"`
	// AllocationError is set when some host got no address.
	AllocationError string `json:"allocationError,omitempty"`
	// WaypointPolicies: waypoint → targetRef policies attached to it.
	WaypointPolicies map[string][]string `json:"waypointPolicies,omitempty"`
	// Addresses and Authorizations are the served resource names.
	Addresses      []string `json:"addresses"`
	Authorizations []string `json:"authorizations"`
	// RemoteClusters: one line per remote cluster a remote secret names
	// and its state (Config.Remotes).
	RemoteClusters []string `json:"remoteClusters,omitempty"`
	// Clients are the node ids of connected xDS streams.
	Clients []string `json:"clients"`
}

// ConfigDump returns the current state.
func (c *ControlPlane) ConfigDump() ConfigDump {
	d := ConfigDump{Objects: map[string][]string{}, Clients: c.xds.Nodes()}
	if c.cfg.SourceErrors != nil {
		for _, e := range c.cfg.SourceErrors() {
			d.SourceErrors = append(d.SourceErrors, e.Error())
		}
	}
	if r, ok := c.cfg.Remotes.(interface{ Report() []string }); ok {
		d.RemoteClusters = r.Report()
	}
	s := c.snap.Load()
	if s == nil {
		return d
	}
	d.Generation = s.generation
	for _, it := range s.objs.Items() {
		if _, ok := it.Obj.(*cluster.IgnoredObject); ok {
			continue
		}
		kind, name, _ := strings.Cut(it.Key, "/")
		d.Objects[kind] = append(d.Objects[kind], strings.TrimPrefix(name, "/"))
	}
	d.Ignored = ignoredLines(s.objs.Ignored)
	r := s.result
	d.InvalidValues = c.invalidLines(r)
	d.Warnings = append([]string(nil), r.Warnings...)
	d.Policies = append([]translate.PolicyStatus(nil), r.Policies...)
	d.Routes = translate.RouteStatuses(c.cfg.Translate, s.objs)
	d.Allocations = append([]autoalloc.Allocation(nil), r.Allocations...)
	if s.allocErr != nil {
		d.AllocationError = s.allocErr.Error()
	}
	d.WaypointPolicies = map[string][]string{}
	for k, v := range r.WaypointPolicies {
		d.WaypointPolicies[k] = append([]string(nil), v...)
	}
	d.Addresses = r.Addresses.Keys()
	d.Authorizations = sortedKeys(r.Authorizations)
	return d
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
