package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/cni/rules"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// PodRef names a pod.
type PodRef struct {
	UID, Namespace, Name string
}

// PodStatus is a pod's redirection status, as served on GET /pods and
// written through StatusWriter.
type PodStatus struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// State is pending, enabled or failed.
	State State `json:"state"`
	// DNSCapture is whether the pod's DNS is redirected to the proxy by the
	// rules in force (DNS capture on and port 53 not excluded).
	DNSCapture bool `json:"dnsCapture"`
	// Settings are the capture settings of the rules in force (the
	// settings that were asked for, when State is failed).
	Settings rules.PodSettings `json:"settings"`
	// UpToDate is false when Settings differ from what the pod's current
	// annotations and the agent's current defaults give, e.g. after the
	// DNS capture default changed: the pod keeps its old rules until it is
	// restarted (or the agent reconciles on startup). Only set on GET /pods.
	UpToDate *bool        `json:"upToDate,omitempty"`
	IPs      []netip.Addr `json:"ips,omitempty"`
	Netns    string       `json:"netns,omitempty"`
	// Via is how the agent learned of the pod: cni, watch or restored.
	Via   string    `json:"via"`
	Error string    `json:"error,omitempty"`
	Since time.Time `json:"since"`
}

// StatusWriter publishes pod redirection status. In Kubernetes this is
// the ambient.istio.io/redirection annotation, patched through pods/status
// (cni/agent/kube.StatusWriter); in local mode LogStatus logs it. Calls for one pod come in order.
type StatusWriter interface {
	// WriteStatus publishes s (a state change or new settings).
	WriteStatus(ctx context.Context, s PodStatus) error
	// ClearStatus removes the pod's status: it left the mesh.
	ClearStatus(ctx context.Context, pod PodRef) error
}

// LogStatus is local mode's StatusWriter: one info line per change.
type LogStatus struct {
	Log *zap.Logger
}

// WriteStatus implements StatusWriter.
func (l LogStatus) WriteStatus(_ context.Context, s PodStatus) error {
	l.Log.Info("pod redirection status",
		zap.String("pod", s.Namespace+"/"+s.Name), zap.String("uid", s.UID),
		zap.String("redirection", string(s.State)), zap.Bool("dns_capture", s.DNSCapture),
		zap.String("settings", settingsSummary(s.Settings)), zap.String("via", s.Via),
		zap.String("netns", s.Netns), zap.String("error", s.Error))
	return nil
}

// ClearStatus implements StatusWriter.
func (l LogStatus) ClearStatus(_ context.Context, pod PodRef) error {
	l.Log.Info("pod redirection status cleared", zap.String("pod", pod.Namespace+"/"+pod.Name), zap.String("uid", pod.UID))
	return nil
}

// settingsSummary is a compact one-line form of the settings for logs.
func settingsSummary(s rules.PodSettings) string {
	var parts []string
	add := func(k string, v any) {
		b, _ := json.Marshal(v)
		parts = append(parts, k+"="+string(b))
	}
	add("dns", effectiveDNS(s))
	if s.BypassInboundCapture {
		add("bypassInbound", true)
	}
	if len(s.ExcludeOutboundPorts) > 0 {
		add("excludeOutboundPorts", s.ExcludeOutboundPorts)
	}
	if len(s.ExcludeOutboundIPRanges) > 0 {
		add("excludeOutboundIPRanges", s.ExcludeOutboundIPRanges)
	}
	if len(s.ExcludeInboundPorts) > 0 {
		add("excludeInboundPorts", s.ExcludeInboundPorts)
	}
	if len(s.RerouteVirtualInterfaces) > 0 {
		add("rerouteVirtualInterfaces", s.RerouteVirtualInterfaces)
	}
	return strings.Join(parts, " ")
}

// effectiveDNS is whether the rules capture DNS.
func effectiveDNS(s rules.PodSettings) bool {
	return s.DNSCapture && !slices.Contains(s.ExcludeOutboundPorts, 53)
}

func settingsEqual(x, y rules.PodSettings) bool {
	return x.IPv6 == y.IPv6 && x.DNSCapture == y.DNSCapture && x.BypassInboundCapture == y.BypassInboundCapture &&
		slices.Equal(x.RerouteVirtualInterfaces, y.RerouteVirtualInterfaces) &&
		slices.Equal(x.ExcludeOutboundPorts, y.ExcludeOutboundPorts) &&
		slices.Equal(x.ExcludeOutboundIPRanges, y.ExcludeOutboundIPRanges) &&
		slices.Equal(x.ExcludeInboundPorts, y.ExcludeInboundPorts)
}

// status renders rec; with objs, UpToDate is filled in from the pod's
// current annotations. The caller may hold a.mu.
func (a *Agent) status(rec *podRec, objs *cluster.Objects) PodStatus {
	s := PodStatus{
		UID: rec.uid, Namespace: rec.namespace, Name: rec.name, State: rec.state,
		DNSCapture: rec.rulesIn && effectiveDNS(rec.settings), Settings: rec.settings,
		IPs: rec.ips, Netns: rec.netnsPath, Via: rec.via, Error: rec.err, Since: rec.since,
	}
	if objs == nil || !rec.rulesIn {
		return s
	}
	for _, p := range objs.Pods {
		if string(p.UID) != rec.uid {
			continue
		}
		want, err := rules.ParseAnnotations(p.Annotations, a.cfg.Defaults)
		up := err == nil && settingsEqual(want, rec.settings)
		s.UpToDate = &up
	}
	return s
}

// Pods returns the status of every tracked pod, sorted by namespace/name.
func (a *Agent) Pods() []PodStatus {
	objs, _ := a.cfg.Source.Current()
	a.mu.Lock()
	out := make([]PodStatus, 0, len(a.pods))
	for _, r := range a.pods {
		out = append(out, a.status(r, objs))
	}
	a.mu.Unlock()
	slices.SortFunc(out, func(x, y PodStatus) int {
		return strings.Compare(x.Namespace+"/"+x.Name+"/"+x.UID, y.Namespace+"/"+y.Name+"/"+y.UID)
	})
	return out
}

// AdminHandler serves GET /pods (JSON array of PodStatus) and GET /ready
// (200 once Run serves and the plugin is installed, else 503 saying why).
func (a *Agent) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /pods", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(a.Pods())
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if why := a.NotReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
