// Package translate turns one cluster.Objects set into the resources istiod
// serves to node proxies over xDS: workloadapi Addresses (Workloads and
// Services), securityapi Authorizations, plus the side results an operator
// needs to understand them (waypoint policy attachments, ServiceEntry
// auto-allocations, per-policy status, warnings).
//
// It follows istiod's ambient index (ambient-protocol.md §4, §5, §6.4) and
// adds two ztunnel-go features, each behind a Config switch:
// EnrollmentFromLabels (local mode has no node agent writing the
// ambient.istio.io/redirection annotation) and EnableExternalNameAlias.
//
// Translate is pure: no I/O, no clock, no logging, and the same input gives
// the same output. It does not allocate ServiceEntry addresses (see
// internal/controlplane/autoalloc) and does not serve anything.
package translate

import (
	"fmt"
	"iter"
	"net/netip"
	"sort"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/xds/resmap"
)

// Defaults for the string fields of Config.
const (
	DefaultClusterID     = "Kubernetes"
	DefaultTrustDomain   = "cluster.local"
	DefaultDomainSuffix  = "cluster.local"
	DefaultRootNamespace = "istio-system"
)

// Config holds the mesh settings translation depends on. Empty strings mean
// the defaults above. The zero value of each bool is "off"; LocalDefaults
// returns the local-mode settings with both features on.
type Config struct {
	// ClusterID goes into workload uids and Workload.cluster_id.
	ClusterID string
	// Network is the default network of workloads and service VIPs. ""
	// means the label topology.istio.io/network of the root namespace (the
	// system namespace, istio-system: Istio's way to name a cluster's
	// network), else the single unnamed network. Pods and namespaces may
	// override it with the same label.
	Network string
	// TrustDomain of workload identities; cluster.local is elided on the wire.
	TrustDomain string
	// DomainSuffix of Kubernetes service hostnames (<name>.<ns>.svc.<suffix>).
	DomainSuffix string
	// RootNamespace holds mesh-wide policies (istio-system).
	RootNamespace string
	// EnrollmentFromLabels makes a pod HBONE-enrolled when it matches the
	// ambient enrollment rule (namespace or pod label
	// istio.io/dataplane-mode=ambient, pod label value "none" opts out, not
	// hostNetwork, no sidecar.istio.io/status annotation), not only when it
	// carries ambient.istio.io/redirection: enabled. In Kubernetes the node
	// agent writes that annotation after it set up capture, so istiod keys
	// off it alone (set false there); in local mode nobody writes it (true).
	EnrollmentFromLabels bool
	// EnableExternalNameAlias emits ExternalName Services whose target is a
	// mesh service as alias Services (see ExternalNameAliasExtension).
	// Off: ExternalName Services are not part of the mesh, as in istiod.
	EnableExternalNameAlias bool
	// JWKS resolves the key sets RequestAuthentication rules name by
	// jwksUri, or leave to OpenID discovery from the issuer (jwks.Resolver,
	// which fetches in the background); its answers go to the waypoints
	// inline. nil: only inline jwks, every other rule rejects its tokens.
	JWKS JWKSResolver
	// PathNormalization is meshConfig pathNormalization, sent to every
	// waypoint (the zero value is Istio's default, BASE).
	PathNormalization waypointapi.PathNormalization

	// DefaultServiceExportTo, DefaultVirtualServiceExportTo and
	// DefaultDestinationRuleExportTo are meshConfig's defaults for objects
	// that set no exportTo ("." own namespace, "*" all, "~" none, or
	// namespace names); nil means "*", as in Istio.
	DefaultServiceExportTo         []string
	DefaultVirtualServiceExportTo  []string
	DefaultDestinationRuleExportTo []string
	// ServiceEntryVisibility is meshConfig.serviceEntryVisibility (Istio
	// 1.31); nil leaves every ServiceEntry to its exportTo.
	ServiceEntryVisibility *meshv1alpha1.ServiceEntryVisibility
	// Telemetry is meshConfig's extensionProviders and defaultProviders,
	// which Telemetry objects name (MeshTelemetry).
	Telemetry TelemetryMesh
	// ServiceScopeConfigs is meshConfig.serviceScopeConfigs: a Service
	// matching a GLOBAL entry is of global scope (multicluster.go).
	ServiceScopeConfigs []*meshv1alpha1.MeshConfig_ServiceScopeConfigs
	// MeshProblems are what meshConfig sets that is not implemented (an
	// extensionProvider kind, say), to log at startup.
	MeshProblems []string
}

// JWKSResolver answers key sets from a cache without blocking: the JSON
// Web Key Set, or why there is none yet (the rule's tokens are rejected).
type JWKSResolver interface {
	JWKS(uri string) (string, error)
	OIDC(issuer string) (string, error)
}

// LocalDefaults returns the local-mode configuration.
func LocalDefaults() Config {
	return Config{EnrollmentFromLabels: true, EnableExternalNameAlias: true}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.ClusterID == "" {
		c.ClusterID = DefaultClusterID
	}
	if c.TrustDomain == "" {
		c.TrustDomain = DefaultTrustDomain
	}
	if c.DomainSuffix == "" {
		c.DomainSuffix = DefaultDomainSuffix
	}
	if c.RootNamespace == "" {
		c.RootNamespace = DefaultRootNamespace
	}
	return c
}

// PolicyStatus says what became of one AuthorizationPolicy or
// PeerAuthentication: whether node proxies get it, and why not.
type PolicyStatus struct {
	Kind string `json:"kind"` // AuthorizationPolicy or PeerAuthentication
	Name string `json:"name"` // namespace/name
	// Sent is true when the policy (or its conversion) is sent to node proxies.
	Sent bool `json:"sent"`
	// Message explains partial conversion or why it is not sent.
	Message string `json:"message,omitempty"`
	// DryRun: sent with dry_run (istio.io/dry-run, or action AUDIT); node
	// proxies log what it would decide and never enforce it.
	DryRun bool `json:"dryRun,omitempty"`
	// Invalid lists the values that cannot be enforced, each
	// "<field path>: <why>" (spec.rules[0].from[0].source.ipBlocks[1]: ...).
	// They fail closed: see Message for what became of their rules.
	Invalid []string `json:"invalid,omitempty"`
}

// Result is everything one translation produces. Maps are keyed by xDS
// resource name. A Result is never mutated after Translate returns.
type Result struct {
	// Addresses: Workloads keyed by uid, Services by "namespace/hostname".
	Addresses *resmap.Map[*workloadapi.Address]
	// Authorizations keyed by "namespace/name".
	Authorizations map[string]*securityapi.Authorization
	// WaypointPolicies maps a waypoint ("namespace/name" of its Gateway) to
	// the AuthorizationPolicies (sorted "namespace/name") attached to it with
	// targetRef(s): to that Gateway, or to GatewayClass istio-waypoint from
	// the root namespace. The waypoint enforces them; node proxies never see
	// them. Waypoints without attached policies are absent.
	WaypointPolicies map[string][]string
	// Allocations are the ServiceEntry auto-allocations the translation used.
	Allocations []autoalloc.Allocation
	// Policies is one status per AuthorizationPolicy and PeerAuthentication,
	// sorted by kind then name.
	Policies []PolicyStatus
	// Warnings, sorted and deduplicated, each prefixed by "Kind ns/name: ".
	Warnings []string

	// bound holds the Addresses bound to a waypoint (waypointBound), kept
	// by the Translator so that waypoint configs need not scan every
	// address; nil: not kept (a Result built elsewhere), scan them all.
	bound *resmap.Map[*workloadapi.Address]
	// services is the sorted Services slice the Translator read (nil
	// when not from a Translator): waypoint configs built from the same
	// slice need not check its order.
	services []*corev1.Service
}

// sortedServices reports whether s is the slice of Services r was
// translated from (hence sorted).
func (r *Result) sortedServices(s []*corev1.Service) bool {
	return r.services != nil && len(r.services) == len(s) && (len(s) == 0 || &r.services[0] == &s[0])
}

// waypointBound iterates over the addresses that may be bound to a
// waypoint: a superset of those with a workload waypoint, a service
// waypoint or weighted waypoints (all of them when r does not keep the set).
func (r *Result) waypointBound() iter.Seq2[string, *workloadapi.Address] {
	if r.bound != nil {
		return r.bound.All()
	}
	return r.Addresses.All()
}

// boundToWaypoint: a has a waypoint (a Workload's, a Service's, or weighted
// ones).
func boundToWaypoint(a *workloadapi.Address) bool {
	if w := a.GetWorkload(); w != nil {
		return w.GetWaypoint() != nil
	}
	s := a.GetService()
	return s.GetWaypoint() != nil || len(s.GetWeightedWaypoints()) > 0
}

// Translate converts objs (in any order) in one go. allocs are the ServiceEntry auto-allocations
// (nil: none). objs may be nil (empty cluster).
func Translate(cfg Config, objs *cluster.Objects, allocs *autoalloc.Allocations) *Result {
	var sorted cluster.Objects
	if objs != nil {
		// Copy the slices so sorting never reorders the caller's set; the
		// objects themselves are only read.
		sorted = cluster.Objects{
			Namespaces:            clone(objs.Namespaces),
			Pods:                  clone(objs.Pods),
			Services:              clone(objs.Services),
			EndpointSlices:        clone(objs.EndpointSlices),
			ServiceEntries:        clone(objs.ServiceEntries),
			WorkloadEntries:       clone(objs.WorkloadEntries),
			AuthorizationPolicies: clone(objs.AuthorizationPolicies),
			PeerAuthentications:   clone(objs.PeerAuthentications),
			Gateways:              clone(objs.Gateways),
			GatewayClasses:        clone(objs.GatewayClasses),
			Nodes:                 clone(objs.Nodes),

			// Only for their statuses (waypoint configs read them).
			RequestAuthentications: clone(objs.RequestAuthentications),
		}
	}
	sorted.Sort()
	res, _ := NewTranslator(cfg).Update(&sorted, allocs)
	return res
}

type translator struct {
	cfg    Config
	objs   *cluster.Objects
	allocs *autoalloc.Allocations

	addresses map[string]*workloadapi.Address
	authz     map[string]*securityapi.Authorization
	wpPols    map[string][]string
	policies  []PolicyStatus
	warnings  map[string]bool

	idx index
	// selectorPolicies are WORKLOAD_SELECTOR authorizations, for matching.
	selectorPolicies []selectorPolicy
	pa               *peerAuthn
	// seAddrs are every ServiceEntry's spec.addresses (accepted or not):
	// a Pod, Service or Node holding one of them decides its ownership,
	// so changing one re-translates everything (ownershipChange).
	seAddrs []netip.Prefix
	// servicesSorted: objs.Services is known to be sorted (the slice a
	// Translator translated), so buildIndexOf need not check it.
	servicesSorted bool
	// routesByParent: routes by "<parent kind> ns/name" (routesOf).
	routesByParent map[string][]attachedRoute
	// apCache holds the previous translation's policy conversions (read
	// only); apNext collects this one's (convertCached). nil: no cache.
	apCache, apNext map[*securityv1.AuthorizationPolicy]convertedPolicy
	// samePolicies, during a re-translation of the global unit whose
	// AuthorizationPolicies did not change, is the previous translator:
	// its selectorPolicies and policiesByNs are taken as they are (and
	// apCache holds every conversion; apNext is nil).
	samePolicies *translator
	// prevPolicies, during a re-translation of the global unit whose
	// AuthorizationPolicies changed only in the namespaces policyNs, is
	// the previous translator: the other namespaces' policiesByNs are its
	// own (indexPolicies).
	prevPolicies *translator
	policyNs     map[string]bool
	// sameAuthz, during a re-translation of the global unit whose
	// AuthorizationPolicies, PeerAuthentications and
	// RequestAuthentications did not change (none with targetRefs, no
	// RequestAuthentication at all), is the previous translator: what
	// translatePolicies produced is taken from it as it is.
	sameAuthz *translator
	// policyStatuses and policyWarns are what translatePolicies produced
	// (read only once set).
	policyStatuses []PolicyStatus
	policyWarns    []string
}

func newTranslator(cfg Config, objs *cluster.Objects, allocs *autoalloc.Allocations) *translator {
	return &translator{
		cfg:       cfg,
		objs:      objs,
		allocs:    allocs,
		addresses: map[string]*workloadapi.Address{},
		authz:     map[string]*securityapi.Authorization{},
		wpPols:    map[string][]string{},
		warnings:  map[string]bool{},
	}
}

func (t *translator) warnf(kind, ns, name, format string, args ...any) {
	obj := name
	if ns != "" {
		obj = ns + "/" + name
	}
	t.warnings[fmt.Sprintf("%s %s: ", kind, obj)+fmt.Sprintf(format, args...)] = true
}

func (t *translator) result(addrs *resmap.Map[*workloadapi.Address], warnings []string) *Result {
	r := &Result{
		Addresses:        addrs,
		Authorizations:   t.authz,
		WaypointPolicies: t.wpPols,
		Allocations:      t.allocs.List(),
		Policies:         t.policies,
	}
	sort.SliceStable(r.Policies, func(i, j int) bool {
		if r.Policies[i].Kind != r.Policies[j].Kind {
			return r.Policies[i].Kind < r.Policies[j].Kind
		}
		return r.Policies[i].Name < r.Policies[j].Name
	})
	r.Warnings = warnings
	return r
}

func clone[T any](s []T) []T { return append([]T(nil), s...) }
