package controlplane

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/caserver"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

func newTestCP(t *testing.T, src cluster.Source, log *zap.Logger) *ControlPlane {
	t.Helper()
	c, err := ca.New(ca.Options{})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := caserver.NewNodeTokens(map[string]string{"node0": "tok0"})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := New(Config{Source: src, Translate: translate.LocalDefaults(), CA: c, Auth: auth, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return cp
}

func decode(t *testing.T, file, doc string) *cluster.Objects {
	t.Helper()
	var o cluster.Objects
	if errs := cluster.Decode(file, []byte(doc), &o); len(errs) > 0 {
		t.Fatal(errs)
	}
	o.Sort()
	return &o
}

// TestIgnoredKinds: an object of a kind the control plane does not read is
// logged once at warning (not on every translation) and listed in the
// config dump's ignored section, not among the objects.
func TestIgnoredKinds(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	cp := newTestCP(t, local.New(t.TempDir(), nil, 0), zap.New(core))
	const vs = `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: reviews, namespace: demo}
spec: {egress: [{hosts: ["./*"]}]}
`
	const dr = `apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: reviews, namespace: demo}
spec: {}
`
	cp.Apply(decode(t, "a.yaml", vs))
	cp.Apply(decode(t, "a.yaml", vs))
	cp.Apply(decode(t, "a.yaml", vs+"---\n"+dr))
	warned := map[string]int{}
	for _, e := range logs.FilterMessageSnippet("ignored object").All() {
		warned[e.ContextMap()["kind"].(string)]++
	}
	if warned["Sidecar"] != 1 || warned["EnvoyFilter"] != 1 {
		t.Errorf("warnings per kind %v, want one each", warned)
	}
	d := cp.ConfigDump()
	if len(d.Ignored) != 2 || !strings.HasPrefix(d.Ignored[0], "EnvoyFilter demo/reviews (networking.istio.io/v1alpha3): ") ||
		!strings.Contains(d.Ignored[1], "Sidecar demo/reviews") || !strings.Contains(d.Ignored[1], "no effect") {
		t.Errorf("dump ignored %q", d.Ignored)
	}
	if _, ok := d.Objects["Sidecar"]; ok {
		t.Errorf("ignored object listed among the loaded objects: %v", d.Objects)
	}
}
