package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAnalyzeDNSCapture: with the node agents' /pods (--agent-file), the
// rules in force decide (not the annotations): a pod whose rules predate
// the agent's settings, a pod with DNS capture off that can use a
// ServiceEntry with an auto-allocated address or an egress waypoint; a
// ServiceEntry exported elsewhere does not count.
func TestAnalyzeDNSCapture(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "mesh.yaml"), `
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: other, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: shop, labels: {istio.io/use-waypoint: egress}}
spec:
  hosts: ["api.example.com"]
  addresses: ["192.0.2.10"]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
  exportTo: ["."]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: auto, namespace: shop}
spec:
  hosts: ["db.example.com"]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: DNS
  exportTo: ["."]
status:
  addresses: [{value: 240.240.0.1, host: db.example.com}]
`)
	pods := filepath.Join(t.TempDir(), "pods.json") // not in dir: local mode reads *.json too
	write(t, pods, `[
  {"uid": "u1", "namespace": "shop", "name": "no-dns", "state": "enabled", "dnsCapture": false, "settings": {"DNSCapture": false}, "upToDate": true},
  {"uid": "u2", "namespace": "shop", "name": "stale", "state": "enabled", "dnsCapture": true, "settings": {"DNSCapture": true}, "upToDate": false},
  {"uid": "u3", "namespace": "other", "name": "no-dns-elsewhere", "state": "enabled", "dnsCapture": false, "settings": {}},
  {"uid": "u4", "namespace": "shop", "name": "failed", "state": "failed", "dnsCapture": false, "settings": {}}
]`)
	var out bytes.Buffer
	if err := run([]string{"analyze", "--agent-file", pods, dir}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{
		"ZTG0013  Warning  Pod shop/stale", "its capture rules (DNS capture on) predate the node agent's current settings", "file " + pods,
		"ZTG0014  Warning  Pod shop/no-dns", "DNS capture is off (the rules in force, file " + pods + ")",
		"ServiceEntry shop/auto (auto-allocated address for db.example.com); ServiceEntry shop/ext (egress waypoint shop/egress)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, not := range []string{"no-dns-elsewhere", "shop/failed"} {
		if strings.Contains(text, not) {
			t.Errorf("output names %s:\n%s", not, text)
		}
	}
	if err := run([]string{"analyze", "--agent-file", filepath.Join(dir, "missing.json"), dir}, &out, &out); err == nil || errors.Is(err, errFindings) {
		t.Errorf("a missing /pods file: %v", err)
	}
	if err := os.WriteFile(pods, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"analyze", "--agent-file", pods, dir}, &out, &out); err == nil || !strings.Contains(err.Error(), "decoding the node agent's /pods") {
		t.Errorf("a bad /pods file: %v", err)
	}
	if err := run([]string{"analyze", "--kubeconfig", pods, dir}, &out, &out); err == nil || !strings.Contains(err.Error(), "one directory of YAML, or --kubeconfig") {
		t.Errorf("a directory and --kubeconfig: %v", err)
	}
}
