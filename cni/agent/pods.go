package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel-go/cni/plugin"
	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/cni/zds"
	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// Errors of an enrollment; the plugin server maps them to HTTP statuses.
var (
	// ErrPending: the rules are in place but no node proxy took the pod
	// (none connected, or it refused). Retryable: the ADD fails and the
	// runtime retries; the pod never runs uncaptured.
	ErrPending = errors.New("agent: pod redirection pending: node proxy did not take the pod")
	// ErrPodUnknown: the cluster source does not show the pod (yet).
	// Retryable.
	ErrPodUnknown = errors.New("agent: pod not found in the cluster source")
	// ErrBadSettings: the pod's annotations cannot be turned into rules.
	// Not retryable until the pod is fixed.
	ErrBadSettings = errors.New("agent: bad pod capture settings")
	// ErrRules: the rules could not be installed in the pod. Not retryable.
	ErrRules = errors.New("agent: installing pod rules failed")
)

// State is a pod's redirection state (the value of Istio's
// ambient.istio.io/redirection annotation, plus failed).
type State string

const (
	// StatePending: rules installed (fail closed), proxy not confirmed.
	StatePending State = "pending"
	// StateEnabled: rules installed and the node proxy acked the pod.
	StateEnabled State = "enabled"
	// StateFailed: the pod could not be captured (bad settings, rules
	// failed, netns not found); Error says why.
	StateFailed State = "failed"
)

// netnsRetry spaces searches for the netns of a running pod that could not
// be proven (each one reads every /proc/PID/cgroup); with a CNI ADD hint
// it retries at once.
const netnsRetry = 10 * time.Second

// How the agent learned about a pod.
const (
	viaCNI      = "cni"      // CNI ADD from the plugin
	viaWatch    = "watch"    // cluster source (already running pod)
	viaRestored = "restored" // state file of an earlier agent run
)

// podRec is one pod the agent tracks. A record with ns == nil only carries
// status (a failed or pending ADD whose sandbox the runtime tears down).
type podRec struct {
	uid, namespace, name string
	info                 *zdsapi.WorkloadInfo
	ips                  []netip.Addr
	netnsPath            string
	ns                   *netns.Handle
	nsID                 netns.ID
	settings             rules.PodSettings // in force (valid when rulesIn)
	rulesIn              bool
	state                State
	err                  string
	via                  string
	since                time.Time
	tried                time.Time // last netns search of a failed watch enrollment
}

func (r *podRec) closeNetns() {
	if r.ns != nil {
		r.ns.Close()
		r.ns = nil
	}
}

func (r *podRec) logFields() []zap.Field {
	return []zap.Field{zap.String("pod", r.namespace+"/"+r.name), zap.String("uid", r.uid)}
}

// Snapshot implements zds.Snapshotter: every pod whose proxy acked (or a
// remembered pod) with a duplicate of its netns fd.
func (a *Agent) Snapshot() []zds.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []zds.Pod
	for _, r := range a.pods {
		if r.ns == nil || r.state != StateEnabled {
			continue
		}
		f, err := zds.DupNetns(r.ns.FD())
		if err != nil {
			a.log.Warn("snapshot: cannot duplicate netns fd; announcing the pod with keep", append(r.logFields(), zap.Error(err))...)
		}
		p := zds.Pod{UID: r.uid, Info: r.info}
		if err == nil {
			p.Netns = f
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y zds.Pod) int {
		switch {
		case x.UID < y.UID:
			return -1
		case x.UID > y.UID:
			return 1
		}
		return 0
	})
	return out
}

// enrollReq is one pod to capture.
type enrollReq struct {
	pod       *corev1.Pod
	ips       []netip.Addr
	netnsPath string
	ns        *netns.Handle // owned by enroll
	via       string
}

// enroll captures a pod: settings, rules inside its netns, probe ipset,
// then the proxy. It takes ownership of req.ns. The caller holds opMu.
func (a *Agent) enroll(ctx context.Context, req enrollReq) error {
	p := req.pod
	rec := &podRec{
		uid: string(p.UID), namespace: p.Namespace, name: p.Name, info: workloadInfo(p),
		ips: req.ips, netnsPath: req.netnsPath, ns: req.ns, nsID: req.ns.ID(), via: req.via, since: time.Now(),
	}
	log := a.log.With(rec.logFields()...)
	fail := func(state State, err error) error {
		rec.state, rec.err = state, err.Error()
		if state != StatePending || req.via == viaCNI {
			// The runtime tears the sandbox down after a failed ADD; a
			// retried ADD brings a new netns.
			rec.closeNetns()
		}
		a.put(ctx, rec)
		return err
	}
	settings, perr := rules.ParseAnnotations(p.Annotations, a.cfg.Defaults)
	if perr != nil {
		if req.via == viaCNI {
			log.Error("pod not captured: bad capture annotation; the CNI ADD fails until it is fixed", zap.Error(perr))
			return fail(StateFailed, fmt.Errorf("%w: %w", ErrBadSettings, perr))
		}
		// A running pod cannot be held back; capturing it with the agent
		// defaults keeps it in the mesh (fail closed) until it is fixed.
		log.Error("bad capture annotation on a running pod; capturing it with the agent defaults", zap.Error(perr))
		rec.err = perr.Error()
	}
	rs, err := rules.InPod(settings)
	if err != nil {
		return fail(StateFailed, fmt.Errorf("%w: %w", ErrBadSettings, err))
	}
	if err := a.cfg.Applier(rec.uid, rec.ns).Apply(rs); err != nil {
		log.Error("installing pod rules failed", zap.String("netns", rec.netnsPath), zap.Error(err))
		return fail(StateFailed, fmt.Errorf("%w: %s: %w", ErrRules, rec.netnsPath, err))
	}
	rec.settings, rec.rulesIn = settings, true
	a.podSysctls(rec)
	if err := a.cfg.Host.AddPodIPs(rec.ips); err != nil {
		// Probes from the node would be captured; the pod still is.
		log.Warn("adding pod IPs to the probe ipset failed; kubelet probes may fail", zap.Error(err))
	}
	if err := a.addToProxy(ctx, rec); err != nil {
		log.Warn("pod redirection pending", zap.Error(err))
		return fail(StatePending, err)
	}
	rec.state = StateEnabled
	a.put(ctx, rec)
	return nil
}

// podSysctls applies Config.PodSysctls to rec's netns (best effort: the
// pod is captured either way; without them a node proxy upgrade may reset
// a connection).
func (a *Agent) podSysctls(rec *podRec) {
	if a.cfg.PodSysctls == nil || rec.ns == nil {
		return
	}
	if err := a.cfg.PodSysctls(rec.ns); err != nil {
		a.log.Warn("setting the pod's sysctls failed; a node proxy upgrade may reset its queued connections",
			append(rec.logFields(), zap.Error(err))...)
	}
}

// addToProxy hands rec's netns to the newest proxy and waits for the ack.
func (a *Agent) addToProxy(ctx context.Context, rec *podRec) error {
	ctx, cancel := context.WithTimeout(ctx, zds.DefaultAckTimeout)
	defer cancel()
	if err := a.zds.AddWorkload(ctx, rec.uid, rec.info, rec.ns.FD()); err != nil {
		return fmt.Errorf("%w: %w", ErrPending, err)
	}
	return nil
}

// put stores rec (replacing any record of its UID), persists the state and
// reports the status.
func (a *Agent) put(ctx context.Context, rec *podRec) {
	a.mu.Lock()
	old := a.pods[rec.uid]
	a.pods[rec.uid] = rec
	if rec.netnsPath != "" && rec.via == viaCNI {
		a.learned[rec.uid] = learnedNetns{path: rec.netnsPath, at: time.Now()}
	}
	a.mu.Unlock()
	if old != nil && old != rec && old.ns != rec.ns {
		old.closeNetns()
	}
	a.persist()
	a.report(ctx, rec)
}

// drop forgets uid (persisting) and clears its status.
func (a *Agent) drop(ctx context.Context, rec *podRec) {
	a.mu.Lock()
	if a.pods[rec.uid] == rec {
		delete(a.pods, rec.uid)
	}
	a.mu.Unlock()
	rec.closeNetns()
	a.persist()
	if err := a.cfg.Status.ClearStatus(ctx, PodRef{UID: rec.uid, Namespace: rec.namespace, Name: rec.name}); err != nil {
		a.log.Warn("clearing pod status failed", append(rec.logFields(), zap.Error(err))...)
	}
}

func (a *Agent) report(ctx context.Context, rec *podRec) {
	if err := a.cfg.Status.WriteStatus(ctx, a.status(rec, nil)); err != nil {
		a.log.Warn("writing pod status failed", append(rec.logFields(), zap.Error(err))...)
	}
}

// unenroll removes a pod from the mesh: probe ipset entry, its rules (unless
// the pod is gone), every proxy's copy, its record. The caller holds opMu.
func (a *Agent) unenroll(ctx context.Context, rec *podRec, podGone bool, why string) {
	log := a.log.With(rec.logFields()...)
	if rec.rulesIn {
		if err := a.cfg.Host.DelPodIPs(a.unsharedIPs(rec)); err != nil {
			log.Warn("removing pod IPs from the probe ipset failed", zap.Error(err))
		}
		if !podGone && rec.ns != nil {
			rs, err := rules.InPod(rec.settings)
			if err == nil {
				err = a.cfg.Applier(rec.uid, rec.ns).Remove(rs)
			}
			if err != nil {
				log.Error("removing pod rules failed", zap.Error(err))
			}
		}
		dctx, cancel := context.WithTimeout(ctx, zds.DefaultAckTimeout)
		if err := a.zds.DelWorkload(dctx, rec.uid); err != nil {
			log.Warn("removing the pod from the node proxy failed", zap.Error(err))
		}
		cancel()
		log.Info("pod removed from the mesh", zap.String("reason", why), zap.Bool("rules_removed", !podGone && rec.ns != nil))
	}
	a.drop(ctx, rec)
}

// unsharedIPs are rec's IPs no other captured pod holds (an IP reused by a
// newer pod before the old one's deletion was seen stays in the ipset).
func (a *Agent) unsharedIPs(rec *podRec) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Addr
	for _, ip := range rec.ips {
		shared := false
		for _, o := range a.pods {
			if o != rec && o.rulesIn && slices.Contains(o.ips, ip) {
				shared = true
			}
		}
		if !shared {
			out = append(out, ip)
		}
	}
	return out
}

// retry re-sends a pending pod (netns kept) to the proxy.
func (a *Agent) retry(ctx context.Context, rec *podRec) {
	if err := a.addToProxy(ctx, rec); err != nil {
		if errors.Is(err, zds.ErrNoProxy) {
			return // still none; the next proxy connection retries
		}
		a.mu.Lock()
		changed := rec.err != err.Error()
		rec.err = err.Error()
		a.mu.Unlock()
		if changed {
			a.log.Warn("pod redirection still pending", append(rec.logFields(), zap.Error(err))...)
			a.report(ctx, rec)
		}
		return
	}
	a.mu.Lock()
	rec.state, rec.err, rec.since = StateEnabled, "", time.Now()
	a.mu.Unlock()
	a.persist()
	a.report(ctx, rec)
}

// nodePods returns this node's pods by UID.
func (a *Agent) nodePods(objs *cluster.Objects) map[string]*corev1.Pod {
	out := map[string]*corev1.Pod{}
	if objs == nil {
		return out
	}
	for _, p := range objs.Pods {
		if p.Spec.NodeName == a.cfg.NodeName {
			out[string(p.UID)] = p
		}
	}
	return out
}

func (a *Agent) isAmbient(objs *cluster.Objects, p *corev1.Pod) (bool, string) {
	return plugin.IsAmbient(p, objs.Namespace(p.Namespace), a.cfg.Enrollment)
}

// sync converges the tracked pods with the cluster source: removes pods
// that are gone or no longer ambient, enrolls running ambient pods never
// seen in a CNI ADD (their namespace was labelled later, or the agent
// restarted), and retries pending ones.
func (a *Agent) sync(ctx context.Context, objs *cluster.Objects) {
	if objs == nil {
		return
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	pods := a.nodePods(objs)
	a.mu.Lock()
	recs := make([]*podRec, 0, len(a.pods))
	for _, r := range a.pods {
		recs = append(recs, r)
	}
	for uid, l := range a.learned {
		if pods[uid] == nil && time.Since(l.at) > learnedGrace {
			delete(a.learned, uid) // the pod is gone
		}
	}
	a.mu.Unlock()
	for _, rec := range recs {
		p := pods[rec.uid]
		if p == nil {
			a.unenroll(ctx, rec, true, "pod deleted")
			continue
		}
		if ok, why := a.isAmbient(objs, p); !ok {
			a.unenroll(ctx, rec, false, why)
			continue
		}
		if rec.ns != nil && rec.state == StatePending {
			a.retry(ctx, rec)
		}
	}
	for uid, p := range pods {
		a.mu.Lock()
		rec := a.pods[uid]
		hint := a.learned[uid].path
		a.mu.Unlock()
		if rec != nil && rec.ns != nil {
			continue
		}
		ips := podIPs(p)
		if p.Spec.HostNetwork || p.Status.Phase != corev1.PodRunning || len(ips) == 0 {
			continue // a starting pod comes through CNI ADD
		}
		if ok, _ := a.isAmbient(objs, p); !ok {
			continue
		}
		if rec != nil && rec.state == StateFailed && rec.via == viaWatch && hint == "" && time.Since(rec.tried) < netnsRetry {
			continue // proof is unlikely to appear soon; do not rescan /proc every sync
		}
		path, ns, err := a.cfg.FindNetns(ctx, p, hint)
		if err != nil {
			if rec != nil {
				a.mu.Lock()
				rec.tried = time.Now()
				a.mu.Unlock()
			}
			if rec == nil || rec.err != err.Error() {
				a.log.Error("not enrolling running pod: its network namespace cannot be proven (it stays uncaptured; status failed)",
					zap.String("pod", p.Namespace+"/"+p.Name), zap.String("uid", uid), zap.Error(err))
				a.put(ctx, &podRec{uid: uid, namespace: p.Namespace, name: p.Name, info: workloadInfo(p), ips: ips,
					state: StateFailed, err: err.Error(), via: viaWatch, since: time.Now(), tried: time.Now()})
			}
			continue
		}
		a.log.Info("enrolling running pod", zap.String("pod", p.Namespace+"/"+p.Name), zap.String("uid", uid), zap.String("netns", path))
		_ = a.enroll(ctx, enrollReq{pod: p, ips: ips, netnsPath: path, ns: ns, via: viaWatch}) // logged and reported inside
	}
}

// reconcile compares every remembered pod's rules with what they should be
// now (current annotations and defaults) and repairs the difference.
func (a *Agent) reconcile(ctx context.Context, objs *cluster.Objects) {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	pods := a.nodePods(objs)
	a.mu.Lock()
	var recs []*podRec
	for _, r := range a.pods {
		if r.ns != nil && r.rulesIn {
			recs = append(recs, r)
		}
	}
	a.mu.Unlock()
	for _, rec := range recs {
		log := a.log.With(rec.logFields()...)
		want := rec.settings
		if p := pods[rec.uid]; p != nil {
			s, err := rules.ParseAnnotations(p.Annotations, a.cfg.Defaults)
			if err != nil {
				log.Error("reconcile: bad capture annotation; keeping the settings in force", zap.Error(err))
			} else {
				want = s
			}
		}
		rs, err := rules.InPod(want)
		if err != nil {
			log.Error("reconcile: cannot build rules", zap.Error(err))
			continue
		}
		// Pods an older agent captured get the sysctls too.
		a.podSysctls(rec)
		ap := a.cfg.Applier(rec.uid, rec.ns)
		diff, err := ap.Check(rs)
		if err != nil {
			log.Error("reconcile: reading pod rules failed", zap.Error(err))
			continue
		}
		if diff.Empty() {
			log.Info("reconcile: pod rules up to date")
			if !settingsEqual(want, rec.settings) {
				a.mu.Lock()
				rec.settings = want
				a.mu.Unlock()
			}
			continue
		}
		log.Warn("reconcile: pod rules differ; repairing", zap.String("diff", diff.String()))
		if err := ap.Apply(rs); err != nil {
			log.Error("reconcile: repairing pod rules failed", zap.Error(err))
			continue
		}
		a.mu.Lock()
		rec.settings = want
		a.mu.Unlock()
		a.report(ctx, rec)
	}
	a.persist()
}

// releaseAll removes every captured pod's rules and probe ipset entries
// (the agent is being uninstalled), keeping the records: the state file
// still names the pods if an agent comes back. The node proxy and the pods'
// status are left alone: both are going away with the install.
func (a *Agent) releaseAll() {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	recs := make([]*podRec, 0, len(a.pods))
	for _, rec := range a.pods {
		if rec.rulesIn && rec.ns != nil {
			recs = append(recs, rec)
		}
	}
	a.mu.Unlock()
	removed := 0
	for _, rec := range recs {
		log := a.log.With(rec.logFields()...)
		rs, err := rules.InPod(rec.settings)
		if err == nil {
			err = a.cfg.Applier(rec.uid, rec.ns).Remove(rs)
		}
		if err != nil {
			log.Error("uninstall: removing pod rules failed; the pod stays redirected", zap.Error(err))
			continue
		}
		if err := a.cfg.Host.DelPodIPs(rec.ips); err != nil {
			log.Warn("uninstall: removing pod IPs from the probe ipset failed", zap.Error(err))
		}
		a.mu.Lock()
		rec.rulesIn = false
		a.mu.Unlock()
		removed++
		log.Info("uninstall: pod rules removed; the pod reaches the network directly")
	}
	a.persist()
	a.log.Info("uninstall: released the captured pods", zap.Int("pods", removed), zap.Int("failed", len(recs)-removed))
}
