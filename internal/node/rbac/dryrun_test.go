package rbac

import (
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
)

func audit(name string, rules ...*securityapi.Rule) *securityapi.Authorization {
	a := pol(name, deny, true, rules...)
	a.Extensions = []*securityapi.Extension{{Name: securityapi.AuditExtension}}
	return a
}

// TestDryRunVerdict: what enforcing the dry-run policies would have done,
// next to what was enforced (which dry-run policies never change).
func TestDryRunVerdict(t *testing.T) {
	tests := []struct {
		name     string
		policies []*securityapi.Authorization
		allowed  bool // enforced
		want     DryRunVerdict
		report   bool
	}{
		{"no dry-run policy", []*securityapi.Authorization{pol("d", deny, false, matchAll)}, false, DryRunVerdict{}, false},
		{"dry-run DENY would deny", []*securityapi.Authorization{pol("dd", deny, true, matchAll)}, true,
			DryRunVerdict{Policy: "ns/dd", Differs: true}, true},
		{"dry-run DENY agrees with enforced DENY", []*securityapi.Authorization{pol("d", deny, false, matchAll), pol("dd", deny, true, matchAll)}, false,
			DryRunVerdict{Policy: "ns/dd"}, true},
		{"dry-run DENY that misses, nothing else", []*securityapi.Authorization{pol("dd", deny, true, matchNone)}, true, DryRunVerdict{}, false},
		{"dry-run ALLOW that misses would deny", []*securityapi.Authorization{pol("da", allow, true, matchNone)}, true,
			DryRunVerdict{Policy: "ns/da", Differs: true}, true},
		{"dry-run ALLOW that matches would allow", []*securityapi.Authorization{pol("da", allow, true, matchAll)}, true,
			DryRunVerdict{Policy: "ns/da", Allowed: true}, true},
		{"dry-run ALLOW would allow what an enforced ALLOW refuses", []*securityapi.Authorization{pol("a", allow, false, matchNone), pol("da", allow, true, matchAll)}, false,
			DryRunVerdict{Policy: "ns/da", Allowed: true, Differs: true}, true},
		{"dry-run ALLOW misses but enforced ALLOW matches", []*securityapi.Authorization{pol("a", allow, false, matchAll), pol("da", allow, true, matchNone)}, true,
			DryRunVerdict{Policy: "ns/da", Allowed: true}, true},
		{"enforced DENY wins over dry-run ALLOW", []*securityapi.Authorization{pol("d", deny, false, matchAll), pol("da", allow, true, matchAll)}, false,
			DryRunVerdict{Policy: "ns/da"}, true},
		{"audit is not a dry-run DENY", []*securityapi.Authorization{audit("au", matchAll)}, true, DryRunVerdict{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ps []*Policy
			for _, a := range tt.policies {
				ps = append(ps, mustPolicy(t, a))
			}
			d := Evaluate(ps, conn())
			if d.Allowed != tt.allowed {
				t.Fatalf("enforced decision %+v, want allowed=%v", d, tt.allowed)
			}
			got, ok := d.DryRun()
			if ok != tt.report || got != tt.want {
				t.Errorf("DryRun() = %+v, %v; want %+v, %v (decision %+v)", got, ok, tt.want, tt.report, d)
			}
		})
	}
}

// TestAudit: an audit policy is reported when it matches and never denies;
// the marker on an enforced policy changes nothing (it stays enforced).
func TestAudit(t *testing.T) {
	au := mustPolicy(t, audit("au", matchAll))
	if !au.Audit || !au.DryRun {
		t.Fatalf("audit policy %+v", au)
	}
	d := Evaluate([]*Policy{au}, conn())
	if !d.Allowed || d.Audited != "ns/au" || d.DryRunDeny != "" {
		t.Errorf("audit match: %+v", d)
	}
	if d := Evaluate([]*Policy{mustPolicy(t, audit("au", matchNone))}, conn()); d.Audited != "" {
		t.Errorf("audit miss reported: %+v", d)
	}
	enforced := audit("d", matchAll)
	enforced.DryRun = false
	p := mustPolicy(t, enforced)
	if p.Audit {
		t.Errorf("audit marker honoured on an enforced policy: %+v", p)
	}
	if d := Evaluate([]*Policy{p}, conn()); d.Allowed {
		t.Errorf("enforced DENY with the audit marker allowed: %+v", d)
	}
}
