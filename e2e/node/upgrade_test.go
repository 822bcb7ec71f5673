package node

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/realnode"
)

// The upgrade rows of issue 16: each DaemonSet rolled to a new image tag
// with helm upgrade while traffic or pod creation goes on. There is no
// registry, so the "new version" is the imported image under another
// reference (realnode TagImage): a changed pod template is what a rollout
// replaces pods for, the bytes need not differ.

// retag gives the image of DaemonSet ds's first container a new tag (its
// current tag plus "-"+suffix) and returns the new tag.
func (e *nodeEnv) retag(t *testing.T, ctx context.Context, ds, suffix string) string {
	t.Helper()
	d, err := e.node.Client.AppsV1().DaemonSets(systemNS).Get(ctx, ds, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img := d.Spec.Template.Spec.Containers[0].Image
	i := strings.LastIndex(img, ":")
	if i < 0 || strings.Contains(img[i:], "/") {
		t.Fatalf("DaemonSet %s image %q has no tag", ds, img)
	}
	tag := img[i+1:] + "-" + suffix
	if err := e.node.TagImage(ctx, img, img[:i+1]+tag); err != nil {
		t.Fatal(err)
	}
	return tag
}

// helmUpgrade runs helm upgrade --reuse-values with extra --set values (no
// --wait: the caller watches the rollout it starts).
func (e *nodeEnv) helmUpgrade(t *testing.T, ctx context.Context, sets ...string) {
	t.Helper()
	args := []string{"upgrade", release, e.chart, "--namespace", systemNS, "--reuse-values"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	if out, err := e.helmCmd(ctx, args...); err != nil {
		t.Fatalf("helm upgrade %v: %v\n%s", sets, err, out)
	}
}

// waitRolledOut waits for DaemonSet ds's rollout and for its old pod to be
// gone from the API.
func (e *nodeEnv) waitRolledOut(t *testing.T, ctx context.Context, ds, oldPod string) {
	t.Helper()
	if out, err := e.node.Kubectl(ctx, "rollout", "status", "-n", systemNS, "daemonset/"+ds, "--timeout=90s"); err != nil {
		t.Fatalf("rollout of %s: %v\n%s", ds, err, out)
	}
	waitUntil(t, 60*time.Second, func() error {
		_, err := e.node.Client.CoreV1().Pods(systemNS).Get(ctx, oldPod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("old pod %s still there (%v)", oldPod, err)
	})
}

var ruleCounters = regexp.MustCompile(`\[\d+:\d+\]`)

// normalRules is iptables-save output without its comment lines (dates)
// and packet counters, for comparing two readings.
func normalRules(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, ruleCounters.ReplaceAllString(l, "[0:0]"))
	}
	return strings.Join(out, "\n")
}

// pidRules is podIptables for a known container pid, usable off the test's
// goroutine.
func pidRules(pid string) (string, error) {
	var b strings.Builder
	for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		if _, err := exec.LookPath(save); err != nil {
			continue
		}
		out, err := exec.Command("nsenter", "-t", pid, "-n", save).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("nsenter %s %s: %w: %s", pid, save, err, out)
		}
		b.Write(out)
	}
	return b.String(), nil
}

var captureRules = []string{"ISTIO_PRERT", "ISTIO_OUTPUT", "15001", "15006"}

func missingRules(rules string) []string {
	var miss []string
	for _, w := range captureRules {
		if !strings.Contains(rules, w) {
			miss = append(miss, w)
		}
	}
	return miss
}

// probePod is an ambient pod whose init container GETs url once -- the
// pod's first traffic, sent before its app starts, so it shows in the node
// proxy's access log only if the pod was captured when it started -- and
// whose app then idles.
func probePod(ns, name, url string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"upgrade-probe": "1"}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			InitContainers: []corev1.Container{{
				Name: "probe", Image: realnode.TestAppImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"get", "-timeout", "5s", url},
			}},
			Containers: []corev1.Container{{
				Name: "app", Image: realnode.TestAppImage, ImagePullPolicy: corev1.PullNever, Args: []string{"pause"},
			}},
		},
	}
}

// TestNodeAgentUpgrade: the agent DaemonSet rolls to a new tag while ambient
// pods are being created. With maxUnavailable 1 no agent runs for a moment;
// the chained plugin stays installed (an upgrade, not an uninstall) and
// fails the pods' sandboxes closed, the kubelet retries them, and every pod
// that runs was captured when it started: its rules are in place, the
// agent enrolled it from the plugin's ADD (not later, as an already running
// pod), and its first connection, made by an init container before the app
// starts, went through the node proxy. A pod captured before the upgrade
// keeps exactly its rules throughout (the old agent does not release it).
func TestNodeAgentUpgrade(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ns = "agent-upgrade"
	e.namespace(t, ns, true)
	ctx := testCtx(t, 4*time.Minute)
	testStart := time.Now()
	srv := e.pod(t, ns, "srv", nil, "serve")
	srvURL, srvAddr := podURL(srv, 8080)
	before := e.pod(t, ns, "before", nil, "pause")
	baseline := e.podIptables(t, before)
	if miss := missingRules(baseline); len(miss) > 0 {
		t.Fatalf("pod %s not captured before the upgrade: no %v in:\n%s", before.Name, miss, baseline)
	}
	waitUntil(t, 30*time.Second, func() error { _, err := e.get(ctx, ns, "before", srvURL); return err })
	oldAgent := e.componentPod(t, "ztunnel-cni")
	oldAgentLog := e.followLog(ctx, systemNS, oldAgent)
	tag := e.retag(t, ctx, "ztunnel-cni", "agent-upgrade")

	// The captured pod's rules, read every 200 ms through the upgrade.
	pid := containerPid(t, before)
	var (
		mu       sync.Mutex
		changed  []string
		readings int
	)
	watchStop, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			r, err := pidRules(pid)
			mu.Lock()
			readings++
			if err != nil {
				changed = append(changed, time.Now().Format("15:04:05.000")+" "+err.Error())
			} else if normalRules(r) != normalRules(baseline) {
				changed = append(changed, fmt.Sprintf("%s rules differ:\n%s", time.Now().Format("15:04:05.000"), r))
			}
			mu.Unlock()
			select {
			case <-watchStop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()

	// New ambient pods: two before the roll, then, from the moment the old
	// agent is told to stop (its deletionTimestamp), one every 300 ms until
	// two seconds after the roll is done, at most maxProbePods in all (the
	// node takes 60 pods, and the new agent's own pod must still fit).
	const maxProbePods = 24
	var (
		created   []string
		createErr error
		stopping  time.Time // when the old agent's pod was seen marked for deletion
	)
	createStop, createDone := make(chan struct{}), make(chan struct{})
	create := func(i int) bool {
		name := fmt.Sprintf("p%02d", i)
		if _, err := e.node.Client.CoreV1().Pods(ns).Create(ctx, probePod(ns, name, srvURL), metav1.CreateOptions{}); err != nil {
			createErr = err
			return false
		}
		created = append(created, name)
		return true
	}
	go func() {
		defer close(createDone)
		if !create(0) || !create(1) {
			return
		}
		for stopping.IsZero() {
			p, err := e.node.Client.CoreV1().Pods(systemNS).Get(ctx, oldAgent, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				stopping = time.Now()
			case err != nil:
				createErr = err
				return
			case p.DeletionTimestamp != nil: // set to the deletion's time plus the grace period
				stopping = time.Now()
			}
			select {
			case <-createStop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		for i := 2; i < maxProbePods; i++ {
			if !create(i) {
				return
			}
			select {
			case <-createStop:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	rollStart := time.Now()
	e.helmUpgrade(t, ctx, "cni.tag="+tag)
	e.waitRolledOut(t, ctx, "ztunnel-cni", oldAgent)
	rolled := time.Since(rollStart)
	time.Sleep(2 * time.Second)
	close(createStop)
	<-createDone
	close(watchStop)
	<-watchDone
	if createErr != nil {
		t.Fatalf("creating pods: %v", createErr)
	}
	if stopping.IsZero() {
		t.Fatalf("never saw the old agent %s being deleted", oldAgent)
	}
	t.Logf("old agent %s seen marked for deletion at %s, %v after helm upgrade started", oldAgent, stopping.Format("15:04:05.000"), stopping.Sub(rollStart).Round(time.Millisecond))
	t.Logf("agent %s rolled to tag %s in %v; %d pods created around it", oldAgent, tag, rolled.Round(time.Millisecond), len(created))

	// The old agent told the upgrade from an uninstall (its DaemonSet is
	// still there) and kept the plugin and the pods' rules.
	agentLines, err := oldAgentLog(30 * time.Second)
	if err != nil {
		t.Errorf("old agent's log: %v", err)
	}
	var decided, kept bool
	for _, l := range agentLines {
		switch l.str("msg") {
		case "uninstall or upgrade?":
			decided = true
			if u, _ := l.Fields["uninstall"].(bool); u {
				t.Errorf("the old agent took the upgrade for an uninstall: %v", l.Fields)
			}
		case "leaving the plugin installed (--keep-on-exit): new ambient pods wait for the next agent":
			kept = true
		case "plugin uninstalled":
			t.Errorf("the old agent uninstalled the plugin on an upgrade: %v", l.Fields)
		}
	}
	if !decided || !kept {
		t.Errorf("old agent's log lacks its upgrade decision (%v) or keeping the plugin (%v):\n%s", decided, kept, dumpLines(agentLines))
	}
	if n := len(agentLines); n > 0 {
		t.Logf("old agent's last line at %s: %q", agentLines[n-1].At.Format("15:04:05.000"), agentLines[n-1].str("msg"))
	}

	// Every pod runs in the end (the kubelet retried the sandboxes the
	// plugin failed while no agent ran).
	pods := map[string]*corev1.Pod{}
	waitUntil(t, 90*time.Second, func() error {
		var waiting []string
		for _, name := range created {
			if p := pods[name]; p != nil && podReady(p) {
				continue
			}
			p, err := e.node.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			pods[name] = p
			if !podReady(p) {
				waiting = append(waiting, name+":"+string(p.Status.Phase)+podWhy(p))
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("%d of %d pods not Ready: %v", len(waiting), len(created), waiting)
		}
		return nil
	})
	t.Logf("all %d pods Ready %v after the roll started", len(created), time.Since(rollStart).Round(time.Millisecond))

	// The window in which the plugin failed sandboxes closed.
	evs, err := e.node.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreatePodSandBox"})
	if err != nil {
		t.Fatal(err)
	}
	var first, last time.Time
	failedPods := map[string]bool{}
	for _, ev := range evs.Items {
		at, end := ev.FirstTimestamp.Time, ev.LastTimestamp.Time
		if at.IsZero() {
			at, end = ev.EventTime.Time, ev.EventTime.Time
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if end.After(last) {
			last = end
		}
		failedPods[ev.InvolvedObject.Name] = true
	}
	if len(evs.Items) > 0 {
		msg := evs.Items[0].Message
		t.Logf("sandbox creation failed (plugin failed closed) for %d pods from %s to %s (roll started %s): %d events, e.g. %q",
			len(failedPods), first.Format("15:04:05"), last.Format("15:04:05"), rollStart.Format("15:04:05.000"), len(evs.Items), msg)
		if !strings.Contains(msg, "ztunnel-cni") && !strings.Contains(msg, "agent") {
			t.Errorf("a sandbox failed for another reason than the agent being away: %q", msg)
		}
	} else {
		t.Logf("no pod creation hit the window without an agent (no FailedCreatePodSandBox events)")
	}

	// Each pod was captured from its start.
	lines, err := e.podLog(ctx, systemNS, e.componentPod(t, "ztunnel"), testStart)
	if err != nil {
		t.Fatal(err)
	}
	names := append([]string(nil), created...)
	sort.Strings(names)
	for _, name := range names {
		p := pods[name]
		if miss := missingRules(e.podIptables(t, p)); len(miss) > 0 {
			t.Errorf("pod %s (%s) runs without capture rules %v", name, p.Status.PodIP, miss)
		}
		rec, err := agentPodByUID(ctx, p.UID)
		switch {
		case err != nil:
			t.Errorf("pod %s: %v", name, err)
		case rec == nil:
			t.Errorf("pod %s (uid %s) is not on the agent's /pods", name, p.UID)
		case rec.State != "enabled":
			t.Errorf("pod %s: agent record %+v, want enabled", name, *rec)
		case rec.Via != "cni" && rec.Via != "restored":
			// "watch": the agent found it already running, i.e. it started
			// without the plugin's ADD reaching an agent.
			t.Errorf("pod %s: agent enrolled it via %q (%+v), want from the plugin's ADD (cni, or restored from the old agent's state)", name, rec.Via, *rec)
		}
		if out := accessLines(lines, p.Status.PodIP, srvAddr, "outbound"); len(out) == 0 {
			t.Errorf("pod %s (%s): its init container's GET %s is not in the node proxy's outbound access log: it started uncaptured", name, p.Status.PodIP, srvURL)
		}
	}

	// The pod captured before the upgrade kept its rules, its record and
	// its traffic through the node proxy.
	mu.Lock()
	t.Logf("pod %s's rules read %d times during the upgrade", before.Name, readings)
	for i, c := range changed {
		if i == 5 {
			t.Errorf("... %d more", len(changed)-5)
			break
		}
		t.Errorf("pod %s captured before the upgrade: %s", before.Name, c)
	}
	mu.Unlock()
	if r := e.podIptables(t, before); normalRules(r) != normalRules(baseline) {
		t.Errorf("pod %s's rules after the upgrade differ from before:\n%s\nbefore:\n%s", before.Name, r, baseline)
	}
	waitUntil(t, 30*time.Second, func() error {
		rec, err := agentPodByUID(ctx, before.UID)
		if err != nil {
			return err
		}
		if rec == nil || rec.State != "enabled" {
			return fmt.Errorf("new agent's record of %s: %+v, want enabled", before.Name, rec)
		}
		return nil
	})
	since := time.Now()
	e.expectGet(t, ctx, ns, "before", srvURL, "pod=srv")
	e.accessLog(t, ctx, since, before.Status.PodIP, srvAddr, 1, 1)
	if t.Failed() {
		t.Logf("events:\n%s", e.events(ns))
	}
}

// loopStats is testapp loop's tally (/stats, /reset, /stop).
type loopStats struct {
	Since   time.Time `json:"since"`
	At      time.Time `json:"at"`
	Running bool      `json:"running"`
	Conn    loopCount `json:"conn"`
	DNS     loopCount `json:"dns"`
}

type loopCount struct {
	OK       int64    `json:"ok"`
	Fail     int64    `json:"fail"`
	Slow     int64    `json:"slow"`
	MaxMs    int64    `json:"max_ms"`
	Failures []string `json:"failures"`
}

// loopCtl asks the client pod's testapp loop for /stats, /reset or /stop.
func (e *nodeEnv) loopCtl(ctx context.Context, ns, pod, op string) (loopStats, error) {
	var st loopStats
	out, err := e.exec(ctx, ns, pod, "/testapp", "get", "-timeout", "10s", "http://127.0.0.1:9090/"+op)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return st, fmt.Errorf("loop /%s: %w: %q", op, err, out)
	}
	return st, nil
}

// followLog collects a pod's JSON log lines from now until its container
// ends (or ctx does); wait returns them.
func (e *nodeEnv) followLog(ctx context.Context, ns, pod string) (wait func(time.Duration) ([]logLine, error)) {
	now := metav1.NewTime(time.Now().Add(-time.Second))
	var (
		lines []logLine
		err   error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		rc, serr := e.node.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Follow: true, Timestamps: true, SinceTime: &now}).Stream(ctx)
		if serr != nil {
			err = serr
			return
		}
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			stamp, rest, ok := strings.Cut(sc.Text(), " ")
			if !ok {
				continue
			}
			at, perr := time.Parse(time.RFC3339Nano, stamp)
			var f map[string]any
			if perr != nil || json.Unmarshal([]byte(rest), &f) != nil {
				continue
			}
			lines = append(lines, logLine{At: at, Fields: f})
		}
		err = sc.Err()
	}()
	return func(d time.Duration) ([]logLine, error) {
		select {
		case <-done:
			return lines, err
		case <-time.After(d):
			return nil, fmt.Errorf("log of %s/%s still open after %v", ns, pod, d)
		}
	}
}

// outboundFrom counts the "connection complete" outbound lines from src
// (an IP) at or after since.
func outboundFrom(lines []logLine, src string, since time.Time) int {
	n := 0
	for _, l := range lines {
		if !l.At.Before(since) && l.str("msg") == "connection complete" && l.str("direction") == "outbound" &&
			strings.HasPrefix(l.str("src.addr"), src+":") {
			n++
		}
	}
	return n
}

// TestNodeProxyUpgrade: the node proxy DaemonSet rolls to a new tag (maxSurge
// 1, maxUnavailable 0) while a client pod opens new connections to a
// ClusterIP Service (four at a time, each followed by a 20 ms pause: over
// a hundred a second) and resolves the Service's name (DNS captured to the
// node proxy) every 20 ms. The new proxy binds the pods'
// listeners beside the old one's (SO_REUSEPORT), takes the pods from the
// agent, and the old one drains on SIGTERM: no connection and no query
// fails or stalls, and both proxies carried some of the connections.
func TestNodeProxyUpgrade(t *testing.T) {
	e := mesh(t)
	e.waitMeshReady(t)
	const ns = "proxy-upgrade"
	e.namespace(t, ns, true)
	ctx := testCtx(t, 4*time.Minute)
	srv := e.pod(t, ns, "srv", map[string]string{"app": "srv"}, "serve")
	svc, err := e.node.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "srv", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "srv"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	host := "srv." + ns + ".svc.cluster.local."
	cli := e.pod(t, ns, "cli", nil, "loop", "-url", "http://"+svc.Spec.ClusterIP+"/", "-want", "pod=srv",
		"-workers", "4", "-lookup", host, "-interval", "20ms", "-timeout", "3s", "-slow", "2s")

	// The handoff's premise: the old proxy's listeners, closing, hand the
	// connections queued on them to the new one's (tcp_migrate_req in each
	// captured pod's namespace; the agent sets it, the proxy cannot).
	for _, p := range []*corev1.Pod{srv, cli} {
		out, err := exec.Command("nsenter", "-t", containerPid(t, p), "-n", "cat", "/proc/sys/net/ipv4/tcp_migrate_req").CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != "1" {
			t.Errorf("pod %s: net.ipv4.tcp_migrate_req=%q (%v) in its netns, want 1: closing the old proxy's listeners resets the connections queued on them", p.Name, got, err)
		}
	}

	// Warm up: the node proxy learns the pods and the Service over xDS.
	waitUntil(t, 60*time.Second, func() error {
		if _, err := e.loopCtl(ctx, ns, "cli", "reset"); err != nil {
			return err
		}
		time.Sleep(time.Second)
		st, err := e.loopCtl(ctx, ns, "cli", "stats")
		if err != nil {
			return err
		}
		if st.Conn.OK == 0 || st.DNS.OK == 0 || st.Conn.Fail+st.Conn.Slow+st.DNS.Fail+st.DNS.Slow > 0 {
			return fmt.Errorf("client loop not clean yet: %+v", st)
		}
		return nil
	})
	if _, err := e.loopCtl(ctx, ns, "cli", "reset"); err != nil {
		t.Fatal(err)
	}

	oldProxy := e.componentPod(t, "ztunnel")
	oldLog := e.followLog(ctx, systemNS, oldProxy)
	tag := e.retag(t, ctx, "ztunnel", "proxy-upgrade")
	rollStart := time.Now()
	e.helmUpgrade(t, ctx, "ztunnel.tag="+tag)
	e.waitRolledOut(t, ctx, "ztunnel", oldProxy)
	rolled := time.Since(rollStart)
	time.Sleep(5 * time.Second)
	st, err := e.loopCtl(ctx, ns, "cli", "stop")
	if err != nil {
		t.Fatal(err)
	}
	newProxy := e.componentPod(t, "ztunnel")
	t.Logf("node proxy %s rolled to %s (tag %s) in %v; client loop over %v: connections %d ok, %d failed, %d slow (max %d ms); DNS %d ok, %d failed, %d slow (max %d ms)",
		oldProxy, newProxy, tag, rolled.Round(time.Millisecond), st.At.Sub(st.Since).Round(time.Millisecond),
		st.Conn.OK, st.Conn.Fail, st.Conn.Slow, st.Conn.MaxMs, st.DNS.OK, st.DNS.Fail, st.DNS.Slow, st.DNS.MaxMs)
	if st.Conn.Fail+st.Conn.Slow > 0 {
		t.Errorf("%d failed and %d slow connections during the node proxy upgrade:\n%s", st.Conn.Fail, st.Conn.Slow, strings.Join(st.Conn.Failures, "\n"))
	}
	if st.DNS.Fail+st.DNS.Slow > 0 {
		t.Errorf("%d failed and %d slow DNS queries during the node proxy upgrade:\n%s", st.DNS.Fail, st.DNS.Slow, strings.Join(st.DNS.Failures, "\n"))
	}
	if st.Conn.OK < 500 || st.DNS.OK < 200 {
		t.Errorf("the client loop did too little to tell (%d connections, %d queries)", st.Conn.OK, st.DNS.OK)
	}

	// Both proxies carried connections of the loop.
	old, err := oldLog(30 * time.Second)
	if err != nil {
		t.Errorf("old node proxy's log: %v", err)
	}
	cur, err := e.podLog(ctx, systemNS, newProxy, rollStart)
	if err != nil {
		t.Fatal(err)
	}
	nOld, nNew := outboundFrom(old, cli.Status.PodIP, st.Since), outboundFrom(cur, cli.Status.PodIP, st.Since)
	t.Logf("outbound connections from the client in the access logs: %d by the old proxy %s, %d by the new %s", nOld, oldProxy, nNew, newProxy)
	if nOld == 0 || nNew == 0 {
		t.Errorf("connections served by the old proxy: %d, by the new: %d; want both", nOld, nNew)
	}
	if t.Failed() {
		t.Logf("old node proxy's log from the roll on:\n%s", dumpLines(sinceLines(old, rollStart)))
	}
}

func sinceLines(lines []logLine, since time.Time) []logLine {
	var out []logLine
	for _, l := range lines {
		if !l.At.Before(since) {
			out = append(out, l)
		}
	}
	return out
}
