package rbac

import (
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// Conn is the connection tuple a destination ztunnel authorizes
// (docs/protocol.md#authorization-policy).
type Conn struct {
	// SrcIP is the TCP peer of the inbound connection (a waypoint or gateway
	// when traffic came through one).
	SrcIP netip.Addr
	// DstIP is the destination workload IP (not the HBONE listener's).
	DstIP netip.Addr
	// DstPort is the resolved target port (not 15008).
	DstPort uint16
	// SrcIdentity is the peer certificate's identity; the zero value means
	// plaintext (no identity): principal, namespace and service-account
	// matches then fail, including presence.
	SrcIdentity identity.Identity
}

// Reason says which step of the evaluation order decided.
type Reason uint8

const (
	// ReasonDenied: an enforced DENY policy matched (Decision.Policy names it).
	ReasonDenied Reason = iota + 1
	// ReasonNoAllowPolicies: no DENY matched and no enforced ALLOW policy
	// applies, so the connection is allowed.
	ReasonNoAllowPolicies
	// ReasonAllowed: an enforced ALLOW policy matched (Decision.Policy names it).
	ReasonAllowed
	// ReasonNoAllowMatched: enforced ALLOW policies apply but none matched.
	ReasonNoAllowMatched
)

func (r Reason) String() string {
	switch r {
	case ReasonDenied:
		return "explicitly denied"
	case ReasonNoAllowPolicies:
		return "no allow policies"
	case ReasonAllowed:
		return "explicitly allowed"
	case ReasonNoAllowMatched:
		return "allow policies exist, but none allowed"
	}
	return "unknown"
}

// Decision is the verdict for one connection.
type Decision struct {
	Allowed bool
	// Policy is the Key ("ns/name") of the enforced DENY that denied or the
	// enforced ALLOW that allowed; "" when no policy decided
	// (ReasonNoAllowPolicies, ReasonNoAllowMatched).
	Policy string
	Reason Reason
	// DryRunDeny is the Key of the first dry-run DENY that matched: enforcing
	// it would have denied. "" when none matched. Never enforced.
	DryRunDeny string
	// DryRunAllow is the Key of the first dry-run ALLOW that matched. "" when
	// none matched. Never enforced.
	DryRunAllow string
	// DryRunAllowNoMatch is true when dry-run ALLOW policies apply but none
	// matched: enforcing them would have denied unless an enforced ALLOW
	// matched.
	DryRunAllowNoMatch bool
	// DryRunAllowFirst is the Key of the first dry-run ALLOW that applies
	// ("" when none does): the policy a DryRunAllowNoMatch report names.
	DryRunAllowFirst string
	// Audited is the Key of the first audit policy (Policy.Audit) that
	// matched; "" when none did. Audit never changes the decision.
	Audited string
}

// DryRunVerdict is what enforcing the dry-run policies along with the
// enforced ones would have decided, for the caller to log and count.
type DryRunVerdict struct {
	// Policy is the dry-run policy the verdict is about: the matching
	// dry-run DENY, else the matching dry-run ALLOW, else the first dry-run
	// ALLOW that applies (none of them matched).
	Policy string
	// Allowed is the would-be decision.
	Allowed bool
	// Differs is true when that is not the decision that was enforced:
	// enforcing the dry-run policies would change what happens.
	Differs bool
}

// DryRun returns what enforcing the dry-run policies would have decided,
// and false when no dry-run policy (other than audit policies) applies. It
// does not allocate. Evaluation order is Evaluate's: a matching dry-run
// DENY denies; otherwise an enforced DENY still denies; otherwise, with
// the dry-run ALLOWs counted as ALLOWs, a connection is allowed when one
// of them or an enforced ALLOW matched.
func (d Decision) DryRun() (DryRunVerdict, bool) {
	switch {
	case d.DryRunDeny != "":
		return DryRunVerdict{Policy: d.DryRunDeny, Differs: d.Allowed}, true
	case d.DryRunAllowFirst == "":
		return DryRunVerdict{}, false
	case d.Reason == ReasonDenied:
		p := d.DryRunAllow
		if p == "" {
			p = d.DryRunAllowFirst
		}
		return DryRunVerdict{Policy: p}, true
	case d.DryRunAllow != "":
		return DryRunVerdict{Policy: d.DryRunAllow, Allowed: true, Differs: !d.Allowed}, true
	}
	allowed := d.Reason == ReasonAllowed
	return DryRunVerdict{Policy: d.DryRunAllowFirst, Allowed: allowed, Differs: allowed != d.Allowed}, true
}

// Evaluate decides conn against the policies that apply to the destination
// workload, in the order of docs/protocol.md#authorization-policy:
//  1. a matching dry-run DENY is only reported (DryRunDeny), a matching
//     audit policy too (Audited);
//  2. a matching enforced DENY denies;
//  3. dry-run ALLOWs are only reported (DryRunAllow, DryRunAllowNoMatch);
//  4. no enforced ALLOW applies ⇒ allow;
//  5. a matching enforced ALLOW allows; otherwise deny.
//
// Policies are tried in slice order, so the first matching policy in that
// order is the one named. Evaluate does not allocate. nil entries are
// skipped.
func Evaluate(policies []*Policy, conn Conn) Decision {
	conn.SrcIP = conn.SrcIP.Unmap()
	conn.DstIP = conn.DstIP.Unmap()
	var d Decision
	haveAllow, haveDryAllow, haveDeny := false, false, false
	// 1. Dry-run DENY and audit: report only.
	for _, p := range policies {
		switch {
		case p == nil:
		case p.Action != Deny:
			if !p.DryRun {
				haveAllow = true
			} else if !haveDryAllow {
				haveDryAllow = true
				d.DryRunAllowFirst = p.Key
			}
		case !p.DryRun:
			haveDeny = true
		case p.Audit:
			if d.Audited == "" && p.matches(&conn) {
				d.Audited = p.Key
			}
		case d.DryRunDeny == "" && p.matches(&conn):
			d.DryRunDeny = p.Key
		}
	}
	// 2. Enforced DENY.
	if haveDeny {
		for _, p := range policies {
			if p != nil && p.Action == Deny && !p.DryRun && p.matches(&conn) {
				d.Policy = p.Key
				d.Reason = ReasonDenied
				return d
			}
		}
	}
	// 3. Dry-run ALLOW: report only.
	if haveDryAllow {
		for _, p := range policies {
			if p != nil && p.Action == Allow && p.DryRun && p.matches(&conn) {
				d.DryRunAllow = p.Key
				break
			}
		}
		d.DryRunAllowNoMatch = d.DryRunAllow == ""
	}
	if !haveAllow {
		d.Allowed = true
		d.Reason = ReasonNoAllowPolicies
		return d
	}
	for _, p := range policies {
		if p != nil && p.Action == Allow && !p.DryRun && p.matches(&conn) {
			d.Allowed = true
			d.Policy = p.Key
			d.Reason = ReasonAllowed
			return d
		}
	}
	d.Reason = ReasonNoAllowMatched
	return d
}

// Matches reports whether conn matches the policy's rules, ignoring its
// action and dry-run flag. It does not allocate.
func (p *Policy) Matches(conn Conn) bool {
	conn.SrcIP = conn.SrcIP.Unmap()
	conn.DstIP = conn.DstIP.Unmap()
	return p.matches(&conn)
}

// matches: any rule; a rule: all clauses; a clause: any non-empty match, or
// no matches at all.
func (p *Policy) matches(c *Conn) bool {
	for ri := range p.Rules {
		if ruleMatches(&p.Rules[ri], c) {
			return true
		}
	}
	return false
}

func ruleMatches(r *Rule, c *Conn) bool {
	for ci := range r.Clauses {
		if !clauseMatches(&r.Clauses[ci], c) {
			return false
		}
	}
	return true
}

func clauseMatches(cl *Clause, c *Conn) bool {
	if len(cl.Matches) == 0 {
		return true
	}
	for mi := range cl.Matches {
		m := &cl.Matches[mi]
		if m.empty() {
			continue
		}
		if m.matches(c) {
			return true
		}
	}
	return false
}

func (m *Match) matches(c *Conn) bool {
	id := &c.SrcIdentity
	hasID := !id.IsZero()
	// Each field type: positive list must have a hit (if populated), not_ list
	// must have none.
	if len(m.DestinationIPs) > 0 && !anyPrefix(m.DestinationIPs, c.DstIP) {
		return false
	}
	if anyPrefix(m.NotDestinationIPs, c.DstIP) {
		return false
	}
	if len(m.SourceIPs) > 0 && !anyPrefix(m.SourceIPs, c.SrcIP) {
		return false
	}
	if anyPrefix(m.NotSourceIPs, c.SrcIP) {
		return false
	}
	if len(m.DestinationPorts) > 0 && !anyPort(m.DestinationPorts, c.DstPort) {
		return false
	}
	if anyPort(m.NotDestinationPorts, c.DstPort) {
		return false
	}
	if len(m.ServiceAccounts) > 0 && !anySA(m.ServiceAccounts, id, hasID) {
		return false
	}
	if anySA(m.NotServiceAccounts, id, hasID) {
		return false
	}
	if len(m.Principals) > 0 && !anyPrincipal(m.Principals, id, hasID) {
		return false
	}
	if anyPrincipal(m.NotPrincipals, id, hasID) {
		return false
	}
	if len(m.Namespaces) > 0 && !anyNamespace(m.Namespaces, id, hasID) {
		return false
	}
	if anyNamespace(m.NotNamespaces, id, hasID) {
		return false
	}
	return true
}

func anyPrefix(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func anyPort(ps []uint16, port uint16) bool {
	for _, p := range ps {
		if p == port {
			return true
		}
	}
	return false
}

func anySA(sas []ServiceAccount, id *identity.Identity, hasID bool) bool {
	if !hasID {
		return false
	}
	for _, sa := range sas {
		if sa.Namespace == id.Namespace && sa.ServiceAccount == id.ServiceAccount {
			return true
		}
	}
	return false
}

func anyNamespace(ms []StringMatch, id *identity.Identity, hasID bool) bool {
	if !hasID {
		return false
	}
	for i := range ms {
		if ms[i].matchString(id.Namespace) {
			return true
		}
	}
	return false
}

func anyPrincipal(ms []StringMatch, id *identity.Identity, hasID bool) bool {
	if !hasID {
		return false
	}
	// The principal is the SPIFFE id without "spiffe://", compared without
	// building the string: td + "/ns/" + ns + "/sa/" + sa.
	j := joined{id.TrustDomain, "/ns/", id.Namespace, "/sa/", id.ServiceAccount}
	for i := range ms {
		if ms[i].matchJoined(&j) {
			return true
		}
	}
	return false
}

func (s *StringMatch) matchString(v string) bool {
	switch s.Kind {
	case Exact:
		return v == s.Value
	case Prefix:
		return len(v) >= len(s.Value) && v[:len(s.Value)] == s.Value
	case Suffix:
		return len(v) >= len(s.Value) && v[len(v)-len(s.Value):] == s.Value
	case Presence:
		return v != ""
	}
	return false
}

func (s *StringMatch) matchJoined(j *joined) bool {
	switch s.Kind {
	case Exact:
		return j.len() == len(s.Value) && j.hasPrefix(s.Value)
	case Prefix:
		return j.hasPrefix(s.Value)
	case Suffix:
		return j.hasSuffix(s.Value)
	case Presence:
		return j.len() > 0
	}
	return false
}

// joined is a string given as the concatenation of its parts, so principals
// can be compared without allocating the concatenation.
type joined [5]string

func (j *joined) len() int {
	n := 0
	for _, p := range j {
		n += len(p)
	}
	return n
}

func (j *joined) hasPrefix(p string) bool {
	for _, part := range j {
		if len(p) <= len(part) {
			return part[:len(p)] == p
		}
		if p[:len(part)] != part {
			return false
		}
		p = p[len(part):]
	}
	return p == ""
}

func (j *joined) hasSuffix(s string) bool {
	for i := len(j) - 1; i >= 0; i-- {
		part := j[i]
		if len(s) <= len(part) {
			return part[len(part)-len(s):] == s
		}
		if s[len(s)-len(part):] != part {
			return false
		}
		s = s[:len(s)-len(part)]
	}
	return s == ""
}
