package translate

import (
	"bytes"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

func shuffle[T any](r *rand.Rand, s []T) {
	r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
}

// TestDeterministic: the output does not depend on input order.
func TestDeterministic(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			objs := loadObjects(t, f)
			want := goldenJSON(t, translateFile(t, name, objs))
			r := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 5; i++ {
				o := *objs
				o.Pods, o.Services, o.ServiceEntries = clone(o.Pods), clone(o.Services), clone(o.ServiceEntries)
				o.AuthorizationPolicies, o.PeerAuthentications, o.Gateways = clone(o.AuthorizationPolicies), clone(o.PeerAuthentications), clone(o.Gateways)
				o.EndpointSlices, o.WorkloadEntries = clone(o.EndpointSlices), clone(o.WorkloadEntries)
				shuffle(r, o.Pods)
				shuffle(r, o.Services)
				shuffle(r, o.ServiceEntries)
				shuffle(r, o.AuthorizationPolicies)
				shuffle(r, o.PeerAuthentications)
				shuffle(r, o.Gateways)
				shuffle(r, o.EndpointSlices)
				shuffle(r, o.WorkloadEntries)
				if got := goldenJSON(t, translateFile(t, name, &o)); !bytes.Equal(got, want) {
					t.Fatalf("shuffle %d changed the output", i)
				}
			}
		})
	}
}

func TestEmpty(t *testing.T) {
	r := Translate(Config{}, nil, nil)
	if r.Addresses.Len() != 0 || len(r.Authorizations) != 0 || len(r.Warnings) != 0 {
		t.Fatalf("empty input gave %+v", r)
	}
	// No PeerAuthentication: no static strict policy.
	r = Translate(Config{}, &cluster.Objects{}, nil)
	if _, ok := r.Authorizations["istio-system/"+StaticStrictPolicyName]; ok {
		t.Fatal("static strict policy emitted without any PeerAuthentication")
	}
}

func TestStringMatches(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"*", "presence"},
		{"*.suffix", "suffix:.suffix"},
		{"prefix*", "prefix:prefix"},
		{"exact", "exact:exact"},
	}
	for _, tc := range tests {
		var bad problems
		m := stringMatches("p", []string{tc.in}, false, &bad)[0]
		var got string
		switch x := m.MatchType.(type) {
		case *securityapi.StringMatch_Presence:
			got = "presence"
		case *securityapi.StringMatch_Suffix:
			got = "suffix:" + x.Suffix
		case *securityapi.StringMatch_Prefix:
			got = "prefix:" + x.Prefix
		case *securityapi.StringMatch_Exact:
			got = "exact:" + x.Exact
		}
		if got != tc.want {
			t.Errorf("%q → %s, want %s", tc.in, got, tc.want)
		}
	}
}
