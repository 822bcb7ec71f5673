package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigDumpIstioctlShape: config-dump takes istioctl ztunnel-config's
// section names (singular, "secret", "all"), its filters (namespace under
// its three names, node, address) and -o json|yaml, printing the node
// proxy's own objects filtered.
func TestConfigDumpIstioctlShape(t *testing.T) {
	p := filepath.Join(t.TempDir(), "dump.json")
	if err := os.WriteFile(p, cannedDump(t), 0o644); err != nil {
		t.Fatal(err)
	}
	zctl := func(args ...string) (string, error) {
		var buf bytes.Buffer
		err := run(append([]string{"config-dump", "--file", p}, args...), &buf, &buf)
		return buf.String(), err
	}
	for _, tc := range []struct {
		args      []string
		has, lack []string
	}{
		{[]string{"workload", "--workload-namespace", "legacy"}, []string{"legacy db"}, []string{"demo client"}},
		{[]string{"workload", "--namespace", "demo"}, []string{"demo client"}, []string{"legacy"}},
		{[]string{"workload", "--node", "node0"}, []string{"demo client"}, []string{"legacy"}},
		{[]string{"workload", "--address", "10.0.2.1"}, []string{"legacy db"}, []string{"demo client"}},
		{[]string{"service", "--service-namespace", "other"}, []string{"SERVICE VIP"}, []string{"echo"}},
		{[]string{"policy", "--policy-namespace", "demo"}, []string{"allow-client"}, nil},
		{[]string{"secret"}, []string{"CERTIFICATE NAME", "Leaf"}, nil},
		{[]string{"all"}, []string{"== workloads", "== services", "== policies", "== certificates", "== pods"}, nil},
	} {
		out, err := zctl(tc.args...)
		if err != nil {
			t.Fatalf("config-dump %v: %v\n%s", tc.args, err, out)
		}
		flat := strings.Join(strings.Fields(out), " ")
		for _, w := range tc.has {
			if !strings.Contains(flat, w) {
				t.Errorf("config-dump %v: no %q in\n%s", tc.args, w, out)
			}
		}
		for _, w := range tc.lack {
			if strings.Contains(flat, w) {
				t.Errorf("config-dump %v: %q should be filtered out of\n%s", tc.args, w, out)
			}
		}
	}

	out, err := zctl("workload", "-o", "json", "--namespace", "legacy")
	if err != nil {
		t.Fatal(err)
	}
	var wls []map[string]any
	if err := json.Unmarshal([]byte(out), &wls); err != nil || len(wls) != 1 || wls[0]["name"] != "db" {
		t.Fatalf("-o json workload --namespace legacy: %v, %v\n%s", wls, err, out)
	}
	out, err = zctl("policy", "-o", "yaml")
	if err != nil || !strings.Contains(out, "name: allow-client") || !strings.Contains(out, "action: ALLOW") {
		t.Fatalf("-o yaml policy: %v\n%s", err, out)
	}
	out, err = zctl("all", "-o", "json")
	var all map[string]json.RawMessage
	if err != nil || json.Unmarshal([]byte(out), &all) != nil || len(all) != len(sectionNames()) {
		t.Fatalf("-o json all: %v, %d sections\n%.300s", err, len(all), out)
	}
	if _, err := zctl("bogus"); err == nil || !strings.Contains(err.Error(), `unknown section "bogus"`) {
		t.Errorf("an unknown section: %v", err)
	}
	if _, err := zctl("workload", "-o", "xml"); err == nil {
		t.Error("-o xml accepted")
	}
}
