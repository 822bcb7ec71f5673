// Package rbac is ztunnel-go's L4 authorization: an evaluation-ready form of
// Istio's istio.security.Authorization resource (Policy, built by FromProto),
// and Evaluate, which decides one connection against the policies that apply
// to the destination workload, following Istio AuthorizationPolicy semantics
// exactly as ztunnel applies them (docs/protocol.md#authorization-policy).
//
// It is pure: it does not know which policies apply to which workload (that is
// internal/node/state, which imports this package and stores *Policy), it does not
// log, and it does not close connections. Evaluate allocates nothing.
package rbac

import (
	"net/netip"
)

// Action is what a matching policy does.
type Action uint8

const (
	// Allow lets matching connections through (when at least one enforced
	// ALLOW policy applies, connections matching none are denied).
	Allow Action = iota
	// Deny rejects matching connections.
	Deny
)

func (a Action) String() string {
	switch a {
	case Allow:
		return "ALLOW"
	case Deny:
		return "DENY"
	}
	return "UNKNOWN"
}

// MarshalText makes Action readable in the admin config dump.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// Scope says how a policy is attached to workloads.
type Scope uint8

const (
	// ScopeGlobal policies apply to every workload (istiod emits them for
	// selector-less policies in the root namespace).
	ScopeGlobal Scope = iota
	// ScopeNamespace policies apply to every workload in Policy.Namespace.
	ScopeNamespace
	// ScopeWorkloadSelector policies apply to the workloads that list the
	// policy's key in their authorization_policies.
	ScopeWorkloadSelector
)

func (s Scope) String() string {
	switch s {
	case ScopeGlobal:
		return "GLOBAL"
	case ScopeNamespace:
		return "NAMESPACE"
	case ScopeWorkloadSelector:
		return "WORKLOAD_SELECTOR"
	}
	return "UNKNOWN"
}

// MarshalText makes Scope readable in the admin config dump.
func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Policy is one converted Authorization. It is immutable once built and
// shared between snapshots and goroutines.
type Policy struct {
	// Key is "namespace/name", the xDS resource name and the name reported in
	// a Decision.
	Key       string `json:"key"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Scope     Scope  `json:"scope"`
	Action    Action `json:"action"`
	// DryRun policies are evaluated and reported but never enforced.
	DryRun bool `json:"dryRun,omitempty"`
	// Audit marks a dry-run policy that came from an AUDIT
	// AuthorizationPolicy (securityapi.AuditExtension): a match is reported
	// as audited (Decision.Audited), not as "would deny". Only set with DryRun.
	Audit bool `json:"audit,omitempty"`
	// Rules: the policy matches if any rule matches. No rules ⇒ the policy
	// never matches (an empty ALLOW denies everything it selects, an empty
	// DENY does nothing).
	Rules []Rule `json:"rules,omitempty"`
}

// Rule matches if all of its clauses match (a rule with no clauses matches
// every connection).
type Rule struct {
	Clauses []Clause `json:"clauses,omitempty"`
}

// Clause matches if any of its matches matches, or if it has none.
type Clause struct {
	Matches []Match `json:"matches,omitempty"`
}

// Match is a conjunction over the populated field types; within one field
// type any value may match (OR); a not_* field holds if none of its values
// match. A Match with every field empty never matches.
type Match struct {
	Namespaces          []StringMatch    `json:"namespaces,omitempty"`
	NotNamespaces       []StringMatch    `json:"notNamespaces,omitempty"`
	Principals          []StringMatch    `json:"principals,omitempty"`
	NotPrincipals       []StringMatch    `json:"notPrincipals,omitempty"`
	SourceIPs           []netip.Prefix   `json:"sourceIps,omitempty"`
	NotSourceIPs        []netip.Prefix   `json:"notSourceIps,omitempty"`
	DestinationIPs      []netip.Prefix   `json:"destinationIps,omitempty"`
	NotDestinationIPs   []netip.Prefix   `json:"notDestinationIps,omitempty"`
	DestinationPorts    []uint16         `json:"destinationPorts,omitempty"`
	NotDestinationPorts []uint16         `json:"notDestinationPorts,omitempty"`
	ServiceAccounts     []ServiceAccount `json:"serviceAccounts,omitempty"`
	NotServiceAccounts  []ServiceAccount `json:"notServiceAccounts,omitempty"`
}

// empty reports whether no field is populated (such a Match never matches).
func (m *Match) empty() bool {
	return len(m.Namespaces) == 0 && len(m.NotNamespaces) == 0 &&
		len(m.Principals) == 0 && len(m.NotPrincipals) == 0 &&
		len(m.SourceIPs) == 0 && len(m.NotSourceIPs) == 0 &&
		len(m.DestinationIPs) == 0 && len(m.NotDestinationIPs) == 0 &&
		len(m.DestinationPorts) == 0 && len(m.NotDestinationPorts) == 0 &&
		len(m.ServiceAccounts) == 0 && len(m.NotServiceAccounts) == 0
}

// ServiceAccount matches a peer identity whose namespace and service account
// are exactly these (the trust domain is not compared, as in Istio).
type ServiceAccount struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

// MatchKind is how a StringMatch compares.
type MatchKind uint8

const (
	// Exact: the value equals Value.
	Exact MatchKind = iota
	// Prefix: the value starts with Value.
	Prefix
	// Suffix: the value ends with Value.
	Suffix
	// Presence: any value matches, as long as there is one (a peer identity
	// exists). Value is empty.
	Presence
)

func (k MatchKind) String() string {
	switch k {
	case Exact:
		return "exact"
	case Prefix:
		return "prefix"
	case Suffix:
		return "suffix"
	case Presence:
		return "presence"
	}
	return "unknown"
}

// MarshalText makes MatchKind readable in the admin config dump.
func (k MatchKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// StringMatch is one string matcher. For principals, the compared value is the
// peer's SPIFFE id without "spiffe://" (for example
// "cluster.local/ns/default/sa/sleep"); for namespaces it is the peer
// identity's namespace.
type StringMatch struct {
	Kind  MatchKind `json:"kind"`
	Value string    `json:"value,omitempty"`
}
