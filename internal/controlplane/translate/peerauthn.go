package translate

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/types/known/emptypb"
	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
)

const kindPA = "PeerAuthentication"

// StaticStrictPolicyName is istiod's name for the DENY policy that refuses
// connections without a peer identity; it lives in the root namespace and
// is listed on every workload whose effective mTLS mode is STRICT.
const StaticStrictPolicyName = "istio_converted_static_strict"

// PortLevelPolicyPrefix names the per-PeerAuthentication DENY policy that
// carries port-level mTLS exceptions: <pa-namespace>/converted_peer_authentication_<pa-name>
// (istiod's name for the same conversion). It is listed on the workloads
// that PeerAuthentication governs, instead of the static strict policy:
//   - base STRICT with PERMISSIVE/DISABLE ports P: one Match
//     {not_principals: [presence], not_destination_ports: P}
//     (deny plaintext except on P);
//   - base PERMISSIVE/DISABLE with STRICT ports S: one Match
//     {not_principals: [presence], destination_ports: S}
//     (deny plaintext on S only).
const PortLevelPolicyPrefix = "converted_peer_authentication_"

type paMode = securityv1beta1.PeerAuthentication_MutualTLS_Mode

const (
	modeUnset      = securityv1beta1.PeerAuthentication_MutualTLS_UNSET
	modeStrict     = securityv1beta1.PeerAuthentication_MutualTLS_STRICT
	modePermissive = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
)

type peerAuthn struct {
	any      bool
	root     *securityv1.PeerAuthentication            // mesh-wide
	byNs     map[string]*securityv1.PeerAuthentication // namespace-wide
	selector []*securityv1.PeerAuthentication          // oldest first
	// converted: PA key → port-level policy key, when one was emitted.
	converted map[string]string
	// portLevelNoop: PA key whose port-level settings change nothing.
	portLevelNoop map[string]bool
}

func (t *translator) translatePeerAuthentications() {
	pa := &peerAuthn{byNs: map[string]*securityv1.PeerAuthentication{}, converted: map[string]string{}, portLevelNoop: map[string]bool{}}
	t.pa = pa
	if len(t.objs.PeerAuthentications) == 0 {
		return
	}
	pa.any = true
	sorted := append([]*securityv1.PeerAuthentication(nil), t.objs.PeerAuthentications...)
	sort.SliceStable(sorted, func(i, j int) bool { return olderMeta(&sorted[i].ObjectMeta, &sorted[j].ObjectMeta) })
	for _, p := range sorted {
		key := p.Namespace + "/" + p.Name
		st := PolicyStatus{Kind: kindPA, Name: key, Sent: true}
		switch {
		case p.Spec.Selector != nil:
			pa.selector = append(pa.selector, p)
		case p.Namespace == t.cfg.RootNamespace && pa.root == nil:
			pa.root = p
		case p.Namespace != t.cfg.RootNamespace && pa.byNs[p.Namespace] == nil:
			pa.byNs[p.Namespace] = p
		default:
			st.Sent = false
			st.Message = "an older PeerAuthentication without selector in this namespace wins; ignored"
			t.warnf(kindPA, p.Namespace, p.Name, "%s", st.Message)
		}
		if bad := unknownModes(p); len(bad) > 0 {
			st.Invalid = bad
			t.warnf(kindPA, p.Namespace, p.Name, "invalid: %s", strings.Join(bad, "; "))
			st.Message = strings.TrimPrefix(st.Message+"; invalid: "+strings.Join(bad, "; "), "; ")
		}
		if p.Spec.Selector == nil && len(p.Spec.PortLevelMtls) > 0 {
			m := "portLevelMtls needs a workload selector; its port-level settings are ignored"
			t.warnf(kindPA, p.Namespace, p.Name, "%s", m)
			st.Message = strings.TrimPrefix(st.Message+"; "+m, "; ")
		}
		t.policies = append(t.policies, st)
	}
	t.authz[t.cfg.RootNamespace+"/"+StaticStrictPolicyName] = &securityapi.Authorization{
		Name:      StaticStrictPolicyName,
		Namespace: t.cfg.RootNamespace,
		Scope:     securityapi.Scope_WORKLOAD_SELECTOR,
		Action:    securityapi.Action_DENY,
		Rules: []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{
			{NotPrincipals: []*securityapi.StringMatch{presence()}},
		}}}}},
	}
	for _, p := range pa.selector {
		t.convertPortLevel(p)
	}
}

// modeOf is m's mode, with a value no Istio release defines read as STRICT:
// a mode that cannot be understood must not let plaintext in (fail closed).
func modeOf(m *securityv1beta1.PeerAuthentication_MutualTLS) paMode {
	mode := m.GetMode()
	if _, known := securityv1beta1.PeerAuthentication_MutualTLS_Mode_name[int32(mode)]; !known {
		return modeStrict
	}
	return mode
}

// unknownModes lists p's mTLS modes no Istio release defines ("field:
// value"), which modeOf reads as STRICT.
func unknownModes(p *securityv1.PeerAuthentication) []string {
	var out []string
	known := func(m *securityv1beta1.PeerAuthentication_MutualTLS) bool {
		_, ok := securityv1beta1.PeerAuthentication_MutualTLS_Mode_name[int32(m.GetMode())]
		return ok
	}
	if !known(p.Spec.GetMtls()) {
		out = append(out, fmt.Sprintf("spec.mtls.mode: unknown value %d, read as STRICT", int32(p.Spec.GetMtls().GetMode())))
	}
	ports := make([]uint32, 0, len(p.Spec.PortLevelMtls))
	for port := range p.Spec.PortLevelMtls {
		ports = append(ports, port)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	for _, port := range ports {
		if m := p.Spec.PortLevelMtls[port]; !known(m) {
			out = append(out, fmt.Sprintf("spec.portLevelMtls[%d].mode: unknown value %d, read as STRICT", port, int32(m.GetMode())))
		}
	}
	return out
}

func presence() *securityapi.StringMatch {
	return &securityapi.StringMatch{MatchType: &securityapi.StringMatch_Presence{Presence: &emptypb.Empty{}}}
}

// inheritedMode is the mode a workload in ns gets without a selector PA.
func (pa *peerAuthn) inheritedMode(ns string) paMode {
	if p := pa.byNs[ns]; p != nil && modeOf(p.Spec.GetMtls()) != modeUnset {
		return modeOf(p.Spec.GetMtls())
	}
	if pa.root != nil && modeOf(pa.root.Spec.GetMtls()) != modeUnset {
		return modeOf(pa.root.Spec.GetMtls())
	}
	return modePermissive
}

func (pa *peerAuthn) baseMode(p *securityv1.PeerAuthentication) paMode {
	if m := modeOf(p.Spec.GetMtls()); m != modeUnset {
		return m
	}
	return pa.inheritedMode(p.Namespace)
}

func (t *translator) convertPortLevel(p *securityv1.PeerAuthentication) {
	if len(p.Spec.PortLevelMtls) == 0 {
		return
	}
	pa := t.pa
	key := p.Namespace + "/" + p.Name
	base := pa.baseMode(p)
	var diff []uint32
	for port, m := range p.Spec.PortLevelMtls {
		pm := modeOf(m)
		if pm == modeUnset {
			continue
		}
		if (pm == modeStrict) != (base == modeStrict) {
			diff = append(diff, port)
		}
	}
	if len(diff) == 0 {
		pa.portLevelNoop[key] = true
		return
	}
	sort.Slice(diff, func(i, j int) bool { return diff[i] < diff[j] })
	m := &securityapi.Match{NotPrincipals: []*securityapi.StringMatch{presence()}}
	if base == modeStrict {
		m.NotDestinationPorts = diff
	} else {
		m.DestinationPorts = diff
	}
	name := PortLevelPolicyPrefix + p.Name
	pkey := p.Namespace + "/" + name
	t.authz[pkey] = &securityapi.Authorization{
		Name:      name,
		Namespace: p.Namespace,
		Scope:     securityapi.Scope_WORKLOAD_SELECTOR,
		Action:    securityapi.Action_DENY,
		Rules:     []*securityapi.Rule{{Clauses: []*securityapi.Clause{{Matches: []*securityapi.Match{m}}}}},
	}
	pa.converted[key] = pkey
}

// peerAuthnPolicies returns the policy keys a workload in ns with labels
// gets from PeerAuthentication: the static strict policy when its effective
// mode is STRICT, or the port-level conversion of its selector PA.
func (t *translator) peerAuthnPolicies(ns string, labels map[string]string) []string {
	pa := t.pa
	if !pa.any {
		return nil
	}
	var sel *securityv1.PeerAuthentication
	for _, p := range pa.selector {
		if p.Namespace == ns && subset(p.Spec.Selector.GetMatchLabels(), labels) {
			sel = p // oldest matching wins
			break
		}
	}
	mode := pa.inheritedMode(ns)
	if sel != nil {
		if k, ok := pa.converted[sel.Namespace+"/"+sel.Name]; ok {
			return []string{k}
		}
		mode = pa.baseMode(sel)
	}
	if mode == modeStrict {
		return []string{fmt.Sprintf("%s/%s", t.cfg.RootNamespace, StaticStrictPolicyName)}
	}
	return nil
}

// ValidatePeerAuthentication returns p's values that translation cannot
// honour as written ("field: why"), for an admission webhook to reject:
// mTLS modes no Istio release defines (translation reads them as STRICT).
func ValidatePeerAuthentication(p *securityv1.PeerAuthentication) []string { return unknownModes(p) }
