package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
)

// TestInvalidValuesLocal: in local mode a policy value that cannot be
// enforced is reported with file, document and field, like a decode error,
// in the config dump and once in the log.
func TestInvalidValuesLocal(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "policies.yaml")
	const data = `apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-bad, namespace: demo}
spec:
  action: DENY
  rules: [{from: [{source: {ipBlocks: [10.1.0.0/33]}}]}]
`
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	src := local.New(dir, nil, 0)
	if _, err := src.Load(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	cp := newTestCP(t, src, zap.New(core))
	objs, _ := src.Current()
	cp.Apply(objs)
	cp.Apply(objs)
	want := file + ": document 1 (AuthorizationPolicy demo/deny-bad): spec.rules[0].from[0].source.ipBlocks[0]: \"10.1.0.0/33\" is not a CIDR"
	d := cp.ConfigDump()
	if len(d.InvalidValues) != 1 || !strings.HasPrefix(d.InvalidValues[0], want) {
		t.Fatalf("invalid values %q, want one starting %q", d.InvalidValues, want)
	}
	if n := logs.FilterMessageSnippet("cannot be enforced").Len(); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
}
