package proxy

import "github.com/prometheus/client_golang/prometheus"

// newDryRunCounter counts what dry-run and audit AuthorizationPolicies
// would have decided (rbac.Decision.DryRun, Decision.Audited), by policy
// ("ns/name") and decision: allow, deny, or audit (an audit policy matched).
// They are never enforced.
func newDryRunCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ztunnel_dry_run_policy_decisions_total",
		Help: "Inbound connections a dry-run or audit AuthorizationPolicy was evaluated for, by policy and what it would have decided (allow, deny; audit: it matched). Never enforced.",
	}, []string{"policy", "decision"})
}

// dryRunDecision counts one verdict; m may be nil (no metrics).
func (m *Metrics) dryRunDecision(policy, decision string) {
	if m != nil {
		m.dryRun.WithLabelValues(policy, decision).Inc()
	}
}

func verdict(allowed bool) string {
	if allowed {
		return "allow"
	}
	return "deny"
}

// newDenialCounter counts the inbound connections authorization denied
// (enforced), by the deciding policy ("ns/name"; "-" when no ALLOW policy
// matched), for the dashboards: Istio's istio_tcp_* labels name no policy.
func newDenialCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ztunnel_authorization_denials_total",
		Help: "Inbound connections denied by authorization, by the deciding policy (\"-\": no ALLOW policy matched).",
	}, []string{"policy"})
}

// denied counts one enforced denial; m may be nil (no metrics).
func (m *Metrics) denied(policy string) {
	if m == nil {
		return
	}
	if policy == "" {
		policy = "-"
	}
	m.denials.WithLabelValues(policy).Inc()
}
