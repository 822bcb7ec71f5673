package rbac

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
)

// FieldError is a conversion failure of one field of an Authorization.
// Field is a path in proto field names, for example
// "rules[0].clauses[1].matches[2].source_ips[0]".
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return "field " + e.Field + ": " + e.Err.Error() }

// Unwrap returns the underlying cause.
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field string, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// FromProto converts and validates an Authorization. Every failure is a
// *FieldError naming the field. Unknown enum numbers, IPs that are not 4 or 16
// bytes, prefix lengths longer than the address, ports above 65535, string
// matches with no kind set and service-account matches with an empty part are
// rejected; extensions other than securityapi.AuditExtension are ignored.
func FromProto(a *securityapi.Authorization) (*Policy, error) {
	if a == nil {
		return nil, &FieldError{Field: "authorization", Err: errors.New("missing")}
	}
	if a.GetName() == "" {
		return nil, fieldErr("name", "required")
	}
	if a.GetNamespace() == "" {
		return nil, fieldErr("namespace", "required")
	}
	p := &Policy{
		Key:       a.GetNamespace() + "/" + a.GetName(),
		Name:      a.GetName(),
		Namespace: a.GetNamespace(),
		DryRun:    a.GetDryRun(),
	}
	// The audit marker only ever relaxes a dry-run policy's report; on an
	// enforced policy it is ignored (the policy stays enforced).
	for _, e := range a.GetExtensions() {
		if e.GetName() == securityapi.AuditExtension && p.DryRun {
			p.Audit = true
		}
	}
	switch a.GetScope() {
	case securityapi.Scope_GLOBAL:
		p.Scope = ScopeGlobal
	case securityapi.Scope_NAMESPACE:
		p.Scope = ScopeNamespace
	case securityapi.Scope_WORKLOAD_SELECTOR:
		p.Scope = ScopeWorkloadSelector
	default:
		return nil, fieldErr("scope", "unknown value %d", int32(a.GetScope()))
	}
	switch a.GetAction() {
	case securityapi.Action_ALLOW:
		p.Action = Allow
	case securityapi.Action_DENY:
		p.Action = Deny
	default:
		return nil, fieldErr("action", "unknown value %d", int32(a.GetAction()))
	}
	if n := len(a.GetRules()); n > 0 {
		p.Rules = make([]Rule, n)
	}
	for ri, r := range a.GetRules() {
		rpath := "rules[" + strconv.Itoa(ri) + "]"
		if n := len(r.GetClauses()); n > 0 {
			p.Rules[ri].Clauses = make([]Clause, n)
		}
		for ci, c := range r.GetClauses() {
			cpath := rpath + ".clauses[" + strconv.Itoa(ci) + "]"
			if n := len(c.GetMatches()); n > 0 {
				p.Rules[ri].Clauses[ci].Matches = make([]Match, n)
			}
			for mi, m := range c.GetMatches() {
				mpath := cpath + ".matches[" + strconv.Itoa(mi) + "]"
				if err := convertMatch(&p.Rules[ri].Clauses[ci].Matches[mi], m, mpath); err != nil {
					return nil, err
				}
			}
		}
	}
	return p, nil
}

func convertMatch(out *Match, m *securityapi.Match, path string) error {
	var err error
	if out.Namespaces, err = convertStrings(m.GetNamespaces(), path+".namespaces"); err != nil {
		return err
	}
	if out.NotNamespaces, err = convertStrings(m.GetNotNamespaces(), path+".not_namespaces"); err != nil {
		return err
	}
	if out.Principals, err = convertStrings(m.GetPrincipals(), path+".principals"); err != nil {
		return err
	}
	if out.NotPrincipals, err = convertStrings(m.GetNotPrincipals(), path+".not_principals"); err != nil {
		return err
	}
	if out.SourceIPs, err = convertPrefixes(m.GetSourceIps(), path+".source_ips"); err != nil {
		return err
	}
	if out.NotSourceIPs, err = convertPrefixes(m.GetNotSourceIps(), path+".not_source_ips"); err != nil {
		return err
	}
	if out.DestinationIPs, err = convertPrefixes(m.GetDestinationIps(), path+".destination_ips"); err != nil {
		return err
	}
	if out.NotDestinationIPs, err = convertPrefixes(m.GetNotDestinationIps(), path+".not_destination_ips"); err != nil {
		return err
	}
	if out.DestinationPorts, err = convertPorts(m.GetDestinationPorts(), path+".destination_ports"); err != nil {
		return err
	}
	if out.NotDestinationPorts, err = convertPorts(m.GetNotDestinationPorts(), path+".not_destination_ports"); err != nil {
		return err
	}
	if out.ServiceAccounts, err = convertSAs(m.GetServiceAccounts(), path+".service_accounts"); err != nil {
		return err
	}
	if out.NotServiceAccounts, err = convertSAs(m.GetNotServiceAccounts(), path+".not_service_accounts"); err != nil {
		return err
	}
	return nil
}

func convertStrings(in []*securityapi.StringMatch, path string) ([]StringMatch, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]StringMatch, len(in))
	for i, s := range in {
		switch v := s.GetMatchType().(type) {
		case *securityapi.StringMatch_Exact:
			out[i] = StringMatch{Kind: Exact, Value: v.Exact}
		case *securityapi.StringMatch_Prefix:
			out[i] = StringMatch{Kind: Prefix, Value: v.Prefix}
		case *securityapi.StringMatch_Suffix:
			out[i] = StringMatch{Kind: Suffix, Value: v.Suffix}
		case *securityapi.StringMatch_Presence:
			out[i] = StringMatch{Kind: Presence}
		default:
			return nil, fieldErr(path+"["+strconv.Itoa(i)+"]", "no match type set (want exact, prefix, suffix or presence)")
		}
	}
	return out, nil
}

func convertPrefixes(in []*securityapi.Address, path string) ([]netip.Prefix, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]netip.Prefix, len(in))
	for i, a := range in {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			return nil, fieldErr(path+"["+strconv.Itoa(i)+"].address", "%d bytes, want 4 or 16", len(a.GetAddress()))
		}
		ip = ip.Unmap()
		if a.GetLength() > uint32(ip.BitLen()) {
			return nil, fieldErr(path+"["+strconv.Itoa(i)+"].length", "%d is longer than the %d-bit address", a.GetLength(), ip.BitLen())
		}
		out[i] = netip.PrefixFrom(ip, int(a.GetLength())).Masked()
	}
	return out, nil
}

func convertPorts(in []uint32, path string) ([]uint16, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]uint16, len(in))
	for i, p := range in {
		if p > 65535 {
			return nil, fieldErr(path+"["+strconv.Itoa(i)+"]", "port %d out of range", p)
		}
		out[i] = uint16(p)
	}
	return out, nil
}

func convertSAs(in []*securityapi.ServiceAccountMatch, path string) ([]ServiceAccount, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]ServiceAccount, len(in))
	for i, s := range in {
		if s.GetNamespace() == "" {
			return nil, fieldErr(path+"["+strconv.Itoa(i)+"].namespace", "required")
		}
		if s.GetServiceAccount() == "" {
			return nil, fieldErr(path+"["+strconv.Itoa(i)+"].serviceAccount", "required")
		}
		out[i] = ServiceAccount{Namespace: s.GetNamespace(), ServiceAccount: s.GetServiceAccount()}
	}
	return out, nil
}
