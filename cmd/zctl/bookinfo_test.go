package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// bookinfoMesh enrolls namespace default (where the samples land: they
// name no namespace) in ambient and binds it to a waypoint.
const bookinfoMesh = `apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {istio.io/dataplane-mode: ambient, istio.io/use-waypoint: waypoint}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: default}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: IPAddress, value: 10.96.9.1}]
`

// istioModuleDir is the istio.io/istio module in the module cache, at the
// version hack/istioctl pins (istio.io/istio is never in our go.mod; `make
// unit` downloads it with `go mod download` in hack/istioctl).
func istioModuleDir(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../hack/istioctl/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	version := ""
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "istio.io/istio" {
			version = f[1]
		}
	}
	if version == "" {
		t.Fatal("hack/istioctl/go.mod does not require istio.io/istio")
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "istio.io", "istio@"+version)
	if _, err := os.Stat(filepath.Join(dir, "samples", "bookinfo")); err != nil {
		t.Skipf("istio.io/istio@%s is not in the module cache (run `cd hack/istioctl && go mod download istio.io/istio`): %v", version, err)
	}
	return dir
}

// readmeSampleRows reads README's table of bookinfo sample findings:
// "sample | level | code | object" for each row between the markers.
func readmeSampleRows(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "<!-- bookinfo-samples:begin -->"):
			in = true
		case strings.Contains(line, "<!-- bookinfo-samples:end -->"):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			cells := strings.Split(strings.Trim(line, "|"), "|")
			if len(cells) < 5 {
				t.Fatalf("README row %q: want sample | level | code | object | reason", line)
			}
			var key []string
			for _, c := range cells[:4] {
				key = append(key, strings.Trim(strings.TrimSpace(c), "`"))
			}
			if strings.TrimSpace(cells[4]) == "" {
				t.Errorf("README row %q gives no reason", line)
			}
			rows = append(rows, strings.Join(key, " | "))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(rows)
	return rows
}

// TestBookinfoSamplesAccepted runs `zctl analyze` on each of Istio's
// bookinfo routing samples (samples/bookinfo/networking/*.yaml and
// samples/bookinfo/gateway-api/*.yaml), each beside bookinfo's Services and
// Deployments (platform/kube/bookinfo.yaml, and bookinfo-versions.yaml,
// which Istio's Gateway API instructions apply for reviews-v1..v3) in
// namespace default, enrolled in ambient and bound to a waypoint. Every
// Error or Warning finding must be a row of README's table, and every row
// must still happen, so the table cannot go stale. Info findings (ZTG0018,
// gateway proxies' config) are not applicable by design.
func TestBookinfoSamplesAccepted(t *testing.T) {
	bookinfo := filepath.Join(istioModuleDir(t), "samples", "bookinfo")
	var platform []byte
	for _, f := range []string{"bookinfo.yaml", "bookinfo-versions.yaml"} {
		b, err := os.ReadFile(filepath.Join(bookinfo, "platform", "kube", f))
		if err != nil {
			t.Fatal(err)
		}
		platform = append(append(platform, b...), "\n---\n"...)
	}
	var samples []string
	for _, dir := range []string{"networking", "gateway-api"} {
		m, err := filepath.Glob(filepath.Join(bookinfo, dir, "*.yaml"))
		if err != nil || len(m) == 0 {
			t.Fatalf("no samples in %s: %v", dir, err)
		}
		samples = append(samples, m...)
	}
	var got []string
	for _, s := range samples {
		name := filepath.Base(filepath.Dir(s)) + "/" + filepath.Base(s)
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for f, content := range map[string][]byte{"mesh.yaml": []byte(bookinfoMesh), "bookinfo.yaml": platform, "sample.yaml": b} {
			if err := os.WriteFile(filepath.Join(dir, f), content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		fs, err := analyzeDir(dir)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, f := range fs {
			switch {
			case f.Level == levelInfo && f.Code != codeGatewayProxy:
				t.Errorf("%s: an Info finding other than %s: %+v", name, codeGatewayProxy, f)
			case f.Level != levelInfo:
				got = append(got, strings.Join([]string{name, f.Level, f.Code, f.Object}, " | "))
				t.Logf("%s: %s %s %s: %s", name, f.Level, f.Code, f.Object, f.Message)
			}
		}
	}
	sort.Strings(got)
	got = slices.Compact(got)
	want := readmeSampleRows(t)
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("finding not in README's bookinfo table: %s", g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("README's bookinfo table lists %s, which no longer happens: remove the row", w)
		}
	}
}
