package deploy_test

import (
	"os"
	"regexp"
	"testing"
)

var renderedImage = regexp.MustCompile(`(?m)(?:image: |--waypoint-image=)ghcr\.io/ztunnel-go/([a-z-]+):(\S+)$`)

// TestChartComponentTags: ztunnel.tag and cni.tag move the node proxy's or
// the agent's image alone (an upgrade of one DaemonSet leaves the other's
// pods alone); unset, every image has image.tag, else the appVersion.
func TestChartComponentTags(t *testing.T) {
	chart, err := os.ReadFile("chart/ztunnel-go/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion: "?([^"\s]+)"?$`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("no appVersion in Chart.yaml")
	}
	app := string(m[1])
	for _, tc := range []struct {
		name string
		args []string
		want map[string]string // component -> tag
	}{
		{"default", nil, map[string]string{"ztunnel": app, "ztunnel-cni": app, "ztunnel-cp": app, "waypoint": app}},
		{"image.tag", []string{"--set", "image.tag=1.2.3"}, map[string]string{"ztunnel": "1.2.3", "ztunnel-cni": "1.2.3", "ztunnel-cp": "1.2.3", "waypoint": "1.2.3"}},
		{"ztunnel.tag", []string{"--set", "image.tag=1.2.3", "--set", "ztunnel.tag=1.2.4"}, map[string]string{"ztunnel": "1.2.4", "ztunnel-cni": "1.2.3", "ztunnel-cp": "1.2.3", "waypoint": "1.2.3"}},
		{"cni.tag", []string{"--set", "cni.tag=next-build"}, map[string]string{"ztunnel": app, "ztunnel-cni": "next-build", "ztunnel-cp": app, "waypoint": app}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := helmTemplate(t, tc.args...)
			if err != nil {
				t.Fatalf("helm template %v: %v\n%s", tc.args, err, out)
			}
			got := map[string]string{}
			for _, m := range renderedImage.FindAllStringSubmatch(out, -1) {
				if prev, ok := got[m[1]]; ok && prev != m[2] {
					t.Errorf("%s rendered with tags %s and %s", m[1], prev, m[2])
				}
				got[m[1]] = m[2]
			}
			for c, tag := range tc.want {
				if got[c] != tag {
					t.Errorf("helm template %v: %s image tag %q, want %q (all: %v)", tc.args, c, got[c], tag, got)
				}
			}
		})
	}
}
