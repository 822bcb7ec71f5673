package node

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

// installDoc holds the install steps (README links to it).
const installDoc = "../../docs/install.md"

// installStep is one marked command block of installDoc:
//
//	<!-- install-step: NAME [retry=DURATION] [fails] [want="TEXT"] -->
//	```sh
//	commands
//	```
type installStep struct {
	name  string
	line  int
	body  string
	retry time.Duration // re-run until it succeeds (as marked) for this long
	fails bool          // it succeeds when the commands fail (a refused request)
	want  string        // its output contains this
}

var stepMarker = regexp.MustCompile(`^<!-- install-step: ([a-z0-9-]+)((?:\s+(?:retry=\S+|fails|want="[^"]*"))*)\s*-->$`)

// parseInstallSteps reads the marked blocks of the doc, in order.
func parseInstallSteps(t *testing.T, path string) []installStep {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var steps []installStep
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cur *installStep
	inBlock := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case inBlock && line == "```":
			steps = append(steps, *cur)
			cur, inBlock = nil, false
		case inBlock:
			cur.body += line + "\n"
		case cur != nil && line == "```sh":
			inBlock = true
		case cur != nil && strings.TrimSpace(line) != "":
			t.Fatalf("%s:%d: step %s: its marker is followed by %q, not a ```sh block", path, n, cur.name, line)
		case strings.HasPrefix(line, "<!-- install-step:"):
			m := stepMarker.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("%s:%d: malformed step marker %q", path, n, line)
			}
			cur = &installStep{name: m[1], line: n}
			for _, a := range regexp.MustCompile(`retry=\S+|fails|want="[^"]*"`).FindAllString(m[2], -1) {
				switch {
				case a == "fails":
					cur.fails = true
				case strings.HasPrefix(a, "retry="):
					if cur.retry, err = time.ParseDuration(strings.TrimPrefix(a, "retry=")); err != nil {
						t.Fatalf("%s:%d: %v", path, n, err)
					}
				default:
					cur.want = strings.TrimSuffix(strings.TrimPrefix(a, `want="`), `"`)
				}
			}
		}
	}
	if cur != nil {
		t.Fatalf("%s: step %s has no closed ```sh block", path, cur.name)
	}
	return steps
}

// installSteps parses installDoc and checks it has the steps this test
// knows what to check after.
func installSteps(t *testing.T) []installStep {
	t.Helper()
	steps := parseInstallSteps(t, installDoc)
	var names []string
	for _, s := range steps {
		names = append(names, s.name)
	}
	want := []string{"vars", "gateway-api-crds", "ca", "images", "precheck", "install", "precheck-after", "enroll",
		"first-request", "strict", "mtls-in-mesh", "plaintext-refused", "waypoint", "l7-allowed", "l7-denied", "uninstall"}
	if !slices.Equal(names, want) {
		t.Fatalf("%s steps %v, want %v (TestNodeInstallByREADME checks what each proves)", installDoc, names, want)
	}
	return steps
}

// TestInstallDocSteps runs without a node: the doc's marked steps parse,
// are the ones TestNodeInstallByREADME knows, and its placeholders are
// documented, so a doc edit that breaks them fails in any go test run.
func TestInstallDocSteps(t *testing.T) {
	steps := installSteps(t)
	vars := substitutePlaceholders(t, steps[0].body, map[string]string{"IMAGES": "/x/images", "SOCK": "/x/sock"})
	for _, w := range []string{"export IMAGES=/x/images", "export SOCK=/x/sock", "export REG=ghcr.io/ztunnel-go"} {
		if !strings.Contains(vars, w) {
			t.Errorf("vars after substitution lack %q:\n%s", w, vars)
		}
	}
	for _, s := range steps {
		if strings.TrimSpace(s.body) == "" {
			t.Errorf("step %s is empty", s.name)
		}
	}
	if d := steps[len(steps)-2]; !d.fails || d.want == "" || d.retry == 0 {
		t.Errorf("the L7 deny step %+v must expect the failure with its message, retried", d)
	}
	if cmd := exec.Command("bash", "-n", "-c", vars+strings.Join(func() []string {
		var b []string
		for _, s := range steps[1:] {
			b = append(b, s.body)
		}
		return b
	}(), "")); cmd.Run() != nil {
		t.Error("the steps are not valid bash (bash -n)")
	}
}

// substitutePlaceholders rewrites the documented placeholders of the vars
// block (`export NAME=value  # comment`) and nothing else.
func substitutePlaceholders(t *testing.T, body string, values map[string]string) string {
	t.Helper()
	var out []string
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		if name, rest, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok && strings.HasPrefix(line, "export ") {
			if v, sub := values[name]; sub {
				comment := ""
				if i := strings.Index(rest, "#"); i >= 0 {
					comment = "   " + rest[i:]
				}
				line = "export " + name + "=" + v + comment
				seen[name] = true
			}
		}
		out = append(out, line)
	}
	for name := range values {
		if !seen[name] {
			t.Fatalf("the doc's vars block documents no placeholder %s", name)
		}
	}
	return strings.Join(out, "\n") + "\n"
}

// TestNodeInstallByREADME follows the install instructions (docs/install.md,
// which README links) literally on the real node: every marked command
// block, in order, run by bash from the repository root with kubectl, helm,
// ctr and a freshly built zctl on PATH, the only substitutions being the
// documented placeholders (the image archives' directory and the node's
// containerd socket). It starts from a bare node (the suite's own release
// uninstalled, istio-system deleted), installs the chart with its default
// values, and goes through precheck before and after, an ambient namespace,
// mTLS between two pods (a STRICT namespace: the mesh client answered, a
// client outside refused), a waypoint and an L7 deny, then the uninstall.
// Besides each step's own outcome, it checks that the in-mesh request went
// over HBONE with the client's identity (the server's node proxy's log).
func TestNodeInstallByREADME(t *testing.T) {
	e := mesh(t)
	steps := installSteps(t)
	ctx := testCtx(t, 15*time.Minute)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}

	// Tools on PATH, as the doc asks: kubectl and helm (built for the
	// node), ctr (containerd's package), zctl built now.
	tools := t.TempDir()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(tools, "zctl"), "../../cmd/zctl").CombinedOutput(); err != nil {
		t.Fatalf("go build zctl: %v\n%s", err, out)
	}
	k8sBin, images := os.Getenv("ZTG_K8S_BIN"), os.Getenv("ZTG_IMAGES")
	if k8sBin == "" || images == "" {
		t.Fatal("ZTG_K8S_BIN and ZTG_IMAGES must be set (make test-node sets them)")
	}
	var env []string
	for _, kv := range e.helmEnv {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+strings.Join([]string{tools, k8sBin, filepath.Dir(e.helm), os.Getenv("PATH")}, ":"))
	vars := substitutePlaceholders(t, steps[0].body, map[string]string{"IMAGES": images, "SOCK": realnode.ContainerdSocket})

	e.bareNode(t, ctx)

	run := func(s installStep) (string, error) {
		sctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(sctx, "bash", "-e", "-c", vars+s.body)
		cmd.Dir, cmd.Env = repo, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	var meshGet time.Time
	for _, s := range steps[1:] {
		start := time.Now()
		deadline := start.Add(s.retry)
		var (
			out  string
			err  error
			good bool
		)
		for attempt := 1; ; attempt++ {
			out, err = run(s)
			good = (err == nil) != s.fails && strings.Contains(out, s.want)
			if good || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		if !good {
			expect := "succeed"
			if s.fails {
				expect = "fail"
			}
			if s.want != "" {
				expect += " saying " + fmt.Sprintf("%q", s.want)
			}
			t.Fatalf("%s:%d step %s (%v): %v, want it to %s; output:\n%s\nevents:\n%s", installDoc, s.line, s.name,
				time.Since(start).Round(time.Millisecond), err, expect, out, e.events("demo"))
		}
		t.Logf("step %s (%v):\n%s", s.name, time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
		switch s.name {
		case "precheck", "precheck-after":
			// The node checks read the node's containerd (not the
			// machine's /etc/containerd) and its CNI directories.
			for _, w := range []string{realnode.CNIConfDir, realnode.ContainerdSocket} {
				if !strings.Contains(out, w) {
					t.Errorf("zctl precheck does not name %s:\n%s", w, out)
				}
			}
		case "install":
			e.checkDefaultInstall(t, ctx)
		case "mtls-in-mesh":
			meshGet = start
			e.checkMeshIdentity(t, ctx, meshGet)
		}
	}
}

// bareNode uninstalls the suite's release and deletes istio-system, so the
// doc's steps start where a new user starts.
func (e *nodeEnv) bareNode(t *testing.T, ctx context.Context) {
	t.Helper()
	if out, err := e.helmCmd(ctx, "status", release, "--namespace", systemNS); err == nil {
		if out, err := e.helmCmd(ctx, "uninstall", release, "--namespace", systemNS, "--wait", "--timeout", "2m"); err != nil {
			t.Fatalf("helm uninstall of the suite's release: %v\n%s", err, out)
		}
	} else {
		t.Logf("no release to uninstall: %s", strings.TrimSpace(out))
	}
	for _, ns := range []string{systemNS, "demo", "outside"} {
		err := e.node.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	waitUntil(t, 2*time.Minute, func() error {
		for _, ns := range []string{systemNS, "demo", "outside"} {
			if _, err := e.node.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("namespace %s not gone yet (%v)", ns, err)
			}
		}
		return nil
	})
	if b, err := os.ReadFile(filepath.Join(realnode.CNIConfDir, "10-"+realnode.NetworkName+".conflist")); err != nil || strings.Contains(string(b), "ztunnel-cni") {
		t.Fatalf("the node's CNI config still chains the plugin after the uninstall (%v):\n%s", err, b)
	}
}

// checkDefaultInstall: the release has the chart's default CNI values (the
// directories left to the runtime's configuration), and the agent put the
// plugin where the node's containerd reads it.
func (e *nodeEnv) checkDefaultInstall(t *testing.T, ctx context.Context) {
	t.Helper()
	out, err := e.helmCmd(ctx, "get", "values", release, "--namespace", systemNS, "-o", "json")
	if err != nil {
		t.Fatalf("helm get values: %v\n%s", err, out)
	}
	if strings.Contains(out, "cniBinDir") || strings.Contains(out, "cniConfDir") {
		t.Errorf("the doc's install sets the CNI directories (%s); it must work with the defaults", strings.TrimSpace(out))
	}
	if b, err := os.ReadFile(filepath.Join(realnode.CNIConfDir, "10-"+realnode.NetworkName+".conflist")); err != nil || !strings.Contains(string(b), `"ztunnel-cni"`) {
		t.Errorf("after the install the node's conflist does not chain ztunnel-cni (%v):\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(realnode.CNIBinDir, "ztunnel-cni")); err != nil {
		t.Errorf("plugin binary not in the node's CNI bin dir: %v", err)
	}
}

// checkMeshIdentity: the doc's in-mesh GET reached the server through its
// node proxy over HBONE, with the client's SPIFFE identity.
func (e *nodeEnv) checkMeshIdentity(t *testing.T, ctx context.Context, since time.Time) {
	t.Helper()
	cli, err := e.node.Client.CoreV1().Pods("demo").Get(ctx, "client", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := e.node.Client.CoreV1().Pods("demo").Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr(srv.Status.PodIP), 8080)
	in, _, _ := e.accessLog(t, ctx, since.Add(-time.Second), cli.Status.PodIP, dst, 1, 0)
	const id = "spiffe://cluster.local/ns/demo/sa/default"
	for _, l := range in {
		if got := l.str("src.identity"); got != id {
			t.Errorf("the server's node proxy saw src.identity %q for the in-mesh GET, want %s", got, id)
		}
	}
	if len(in) > 0 {
		t.Logf("server's node proxy: the GET came over HBONE as %s", in[0].str("src.identity"))
	}
}
