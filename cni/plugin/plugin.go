// Package plugin is the chained CNI plugin of ztunnel-go
// (docs/protocol.md#capture-rules): on ADD it decides whether the pod is
// ambient (IsAmbient, from a PodSource) and, if so, hands the pod to the node agent over the agent's
// unix-socket HTTP API (AddRequest to PathAdd), failing the ADD when the
// agent is unreachable or refuses, so no ambient pod ever starts uncaptured.
// Non-ambient pods get prevResult back without the agent being contacted. DEL
// and CHECK are no-ops. Main is the binary's entry point.
//
// It is not the agent: it writes no rules and talks no ZDS; the agent's HTTP
// handler (which consumes AddRequest and LogEntry) lives with the agent.
package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
)

// Timing of an ADD.
const (
	// AgentTimeout bounds the POST to PathAdd.
	AgentTimeout = 5 * time.Second
	// logTimeout bounds each best-effort POST to PathLog.
	logTimeout = 500 * time.Millisecond
	// netnsTimeout bounds the best-effort POST to PathNetns of a pod that
	// is not ambient (a missing agent refuses the connection at once).
	netnsTimeout = 200 * time.Millisecond
	// lookupAttempts × lookupInterval is how long an ADD waits for a pod
	// the metadata source does not know yet.
	lookupAttempts = 5
	lookupInterval = 200 * time.Millisecond
)

// Config is the plugin's entry in the CNI network configuration list.
type Config struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Type       string `json:"type"`

	// AgentSocket is the agent's HTTP unix socket; "" means
	// DefaultAgentSocket.
	AgentSocket string `json:"agent_socket,omitempty"`
	// LogLevel is debug, info, warn or error; "" means info.
	LogLevel string `json:"log_level,omitempty"`
	// AmbientEnabled false turns the plugin into a pass-through; nil
	// (absent) means true, so a hand-written conflist fails closed.
	AmbientEnabled *bool `json:"ambient_enabled,omitempty"`
	// ExcludeNamespaces are never captured.
	ExcludeNamespaces []string `json:"exclude_namespaces,omitempty"`
	// SystemNamespace holds the mesh's own pods; "" means
	// DefaultSystemNamespace.
	SystemNamespace string `json:"system_namespace,omitempty"`
	// LocalConfigDir is local mode's YAML directory, the PodSource. Empty
	// means no source: then every pod is sent to the agent, which decides
	// (and an unreachable agent fails every ADD; see Decide).
	LocalConfigDir string `json:"local_config_dir,omitempty"`
	// Kubeconfig is a kubeconfig file; when set the pod and namespace are
	// looked up in the Kubernetes API (through the KubeSourceFunc given to
	// MainWith) instead of LocalConfigDir.
	Kubeconfig string `json:"kubeconfig,omitempty"`
}

// KubeSourceFunc builds the PodSource for Config.Kubeconfig. The binary
// supplies it (cni/agent/kube.NewPodSource) so this package stays free of
// client-go.
type KubeSourceFunc func(kubeconfig string) (PodSource, error)

// ParseConfig decodes the stdin configuration, applies defaults and parses
// prevResult, which a chained plugin must have.
func ParseConfig(stdin []byte) (*Config, types.Result, error) {
	var conf Config
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, nil, fmt.Errorf("ztunnel-cni: bad network configuration: %w", err)
	}
	var pc types.PluginConf
	if err := json.Unmarshal(stdin, &pc); err != nil {
		return nil, nil, fmt.Errorf("ztunnel-cni: bad network configuration: %w", err)
	}
	if err := version.ParsePrevResult(&pc); err != nil {
		return nil, nil, fmt.Errorf("ztunnel-cni: bad prevResult: %w", err)
	}
	if pc.PrevResult == nil {
		return nil, nil, errors.New("ztunnel-cni: no prevResult: this plugin must be chained after the pod network plugin in a conflist")
	}
	if conf.AgentSocket == "" {
		conf.AgentSocket = DefaultAgentSocket
	}
	if conf.LogLevel == "" {
		conf.LogLevel = "info"
	}
	if _, err := zap.ParseAtomicLevel(conf.LogLevel); err != nil {
		return nil, nil, fmt.Errorf("ztunnel-cni: log_level %q: %w", conf.LogLevel, err)
	}
	return &conf, pc.PrevResult, nil
}

func (c *Config) ambientEnabled() bool { return c.AmbientEnabled == nil || *c.AmbientEnabled }

func (c *Config) enrollment() Enrollment {
	return Enrollment{ExcludeNamespaces: c.ExcludeNamespaces, SystemNamespace: c.SystemNamespace}
}

// podArgs are the Kubernetes keys of CNI_ARGS.
type podArgs struct {
	Name, Namespace, UID string
}

// parseArgs reads K8S_POD_NAME, K8S_POD_NAMESPACE and K8S_POD_UID from
// CNI_ARGS ("K=V;K=V"); other keys are ignored.
func parseArgs(s string) (podArgs, error) {
	var a podArgs
	for kv := range strings.SplitSeq(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return podArgs{}, fmt.Errorf("ztunnel-cni: CNI_ARGS item %q is not KEY=VALUE", kv)
		}
		switch k {
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_UID":
			a.UID = v
		}
	}
	return a, nil
}

// Main is the CNI plugin binary: it reads CNI_* and stdin, runs the command
// and exits (status 1 with a CNI error on stdout on failure).
func Main() { MainWith(nil) }

// MainWith is Main with a PodSource factory for configurations that name a
// kubeconfig; nil means such configurations fail every ADD (fail closed).
func MainWith(kube KubeSourceFunc) {
	add := func(args *skel.CmdArgs) error { return cmdAdd(args, kube) }
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: noop, Check: noop},
		version.VersionsStartingFrom("0.3.0"),
		"ztunnel-cni: chained CNI plugin handing ambient pods to the ztunnel-go node agent")
}

func noop(*skel.CmdArgs) error { return nil }

func cmdAdd(args *skel.CmdArgs, kube KubeSourceFunc) error {
	conf, prev, err := ParseConfig(args.StdinData)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	pa, err := parseArgs(args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	log := newLogger(conf, pa, args.ContainerID)
	defer log.Sync()
	var src PodSource
	switch {
	case conf.Kubeconfig != "" && kube == nil:
		src = errSource{errors.New("ztunnel-cni: kubeconfig configured but this binary has no Kubernetes pod source")}
	case conf.Kubeconfig != "":
		if src, err = kube(conf.Kubeconfig); err != nil {
			// Excluded namespaces still pass and the agent may decide (add).
			src = errSource{fmt.Errorf("ztunnel-cni: Kubernetes pod source: %w", err)}
		}
	case conf.LocalConfigDir != "":
		src = LocalDirSource{Dir: conf.LocalConfigDir}
	}
	a := &adder{log: log, src: src, attempts: lookupAttempts, interval: lookupInterval}
	if err := a.add(context.Background(), conf, prev, pa, args.Netns); err != nil {
		log.Error("CNI ADD failed", zap.Error(err))
		return err
	}
	return types.PrintResult(prev, conf.CNIVersion)
}

// errMetadataUnavailable marks a decide error caused by the metadata source
// itself (not an answer from it).
var errMetadataUnavailable = errors.New("pod metadata unavailable")

// errSource is a PodSource that could not be built: every Lookup fails
// with its error (not ErrPodNotFound), so the agent decides.
type errSource struct{ err error }

func (s errSource) Lookup(context.Context, string, string) (*corev1.Pod, *corev1.Namespace, error) {
	return nil, nil, s.err
}

// adder runs the ADD decision and the agent call; cmdAdd wires it.
type adder struct {
	log *zap.Logger
	// src is the pod metadata; nil means none (the agent decides).
	src      PodSource
	attempts int
	interval time.Duration
}

// add returns nil when prevResult is to be returned unchanged, or a
// *types.Error.
func (a *adder) add(ctx context.Context, conf *Config, prev types.Result, pa podArgs, netnsPath string) error {
	if !conf.ambientEnabled() {
		a.log.Debug("ambient disabled; passing through")
		return nil
	}
	if pa.Name == "" || pa.Namespace == "" {
		a.log.Info("no K8S_POD_NAME/K8S_POD_NAMESPACE in CNI_ARGS; not a Kubernetes pod, passing through")
		return nil
	}
	// Excluded namespaces (kube-system, say) are decided from the config
	// alone: such pods never wait for, or fail on, the API server or the
	// agent (an uninstalled agent's revoked token, an agent restart).
	if slices.Contains(conf.ExcludeNamespaces, pa.Namespace) {
		a.log.Debug("namespace excluded; passing through", zap.String("reason", reasonExcludedNamespace))
		return nil
	}
	ambient, reason, err := a.decide(ctx, conf, pa)
	if err != nil && !errors.Is(err, errMetadataUnavailable) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	if err != nil {
		// The metadata cannot be read (API server down, token revoked):
		// the agent, with its own cache, decides instead; only if it is
		// unreachable too does the ADD fail (closed: the pod may be ambient).
		a.log.Warn("pod metadata unavailable; the node agent decides", zap.Error(err))
		req, rerr := addRequest(prev, pa, netnsPath)
		if rerr != nil {
			return types.NewError(types.ErrDecodingFailure, rerr.Error(), "")
		}
		resp, perr := postAdd(ctx, conf.AgentSocket, req)
		if perr != nil {
			return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%v; and the node agent cannot decide either: %v", err, perr), "")
		}
		a.log.Info("pod handed to the node agent (metadata unavailable)", zap.Bool("captured", resp.Captured))
		return nil
	}
	req, err := addRequest(prev, pa, netnsPath)
	if !ambient {
		a.log.Debug("pod not ambient; passing through", zap.String("reason", reason))
		if err == nil && pa.UID != "" {
			reportNetns(ctx, conf.AgentSocket, req)
		}
		return nil
	}
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	resp, err := postAdd(ctx, conf.AgentSocket, req)
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	a.log.Info("pod handed to the node agent", zap.String("reason", reason), zap.Bool("captured", resp.Captured))
	return nil
}

// decide applies IsAmbient to the source's metadata. Without a source the
// answer is "ambient, the agent decides". A pod the source does not know
// after the retries is ambient (fail closed: an error asking the runtime to
// retry) if its namespace is ambient-labelled, else not ambient: local mode
// writes pods and namespaces as files, and a pod whose file is absent in a
// plain namespace is not the mesh's. A source that cannot be read fails
// closed too.
func (a *adder) decide(ctx context.Context, conf *Config, pa podArgs) (ambient bool, reason string, err error) {
	if a.src == nil {
		return true, "no pod metadata source; the agent decides", nil
	}
	e := conf.enrollment()
	for i := 0; ; i++ {
		pod, ns, err := a.src.Lookup(ctx, pa.Namespace, pa.Name)
		if err == nil && pa.UID != "" && pod.UID != "" && string(pod.UID) != pa.UID {
			err = fmt.Errorf("plugin: %s/%s has UID %s, CNI_ARGS says %s (an older pod of that name): %w", pa.Namespace, pa.Name, pod.UID, pa.UID, ErrPodNotFound)
		}
		switch {
		case err == nil:
			ok, why := IsAmbient(pod, ns, e)
			return ok, why, nil
		case !errors.Is(err, ErrPodNotFound):
			return false, "", fmt.Errorf("ztunnel-cni: cannot tell whether pod %s/%s is ambient (%w): %w; the pod will be retried (no ambient pod starts uncaptured)", pa.Namespace, pa.Name, errMetadataUnavailable, err)
		case i+1 >= a.attempts:
			if namespaceAmbient(pa.Namespace, ns, e) {
				return false, "", fmt.Errorf("ztunnel-cni: pod %s/%s not found in the pod metadata but its namespace is ambient (%w); the pod will be retried (no ambient pod starts uncaptured)", pa.Namespace, pa.Name, err)
			}
			return false, reasonNoPod + " and its namespace is not ambient", nil
		}
		a.log.Debug("pod not in the metadata source yet; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return false, "", ctx.Err()
		case <-time.After(a.interval):
		}
	}
}

// addRequest builds the agent event from prevResult.
func addRequest(prev types.Result, pa podArgs, netnsPath string) (AddRequest, error) {
	r, err := types100.NewResultFromResult(prev)
	if err != nil {
		return AddRequest{}, fmt.Errorf("ztunnel-cni: convert prevResult: %w", err)
	}
	req := AddRequest{Netns: netnsPath, PodName: pa.Name, PodNamespace: pa.Namespace, PodUID: pa.UID}
	for _, ip := range r.IPs {
		addr, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			return AddRequest{}, fmt.Errorf("ztunnel-cni: prevResult address %v is not an IP", ip.Address.IP)
		}
		ones, _ := ip.Address.Mask.Size()
		pip := PodIP{Address: netip.PrefixFrom(addr.Unmap(), ones)}
		if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(r.Interfaces) {
			pip.Interface = r.Interfaces[*ip.Interface].Name
		}
		if gw, ok := netip.AddrFromSlice(ip.Gateway); ok {
			pip.Gateway = gw.Unmap()
		}
		req.IPs = append(req.IPs, pip)
	}
	return req, nil
}

func agentClient(socket string, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			DisableKeepAlives: true,
		},
	}
}

// reportNetns tells the agent, best effort, which sandbox namespace the
// runtime made for a pod that is not ambient now (PathNetns).
func reportNetns(ctx context.Context, socket string, req AddRequest) {
	body, err := json.Marshal(req)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, netnsTimeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://unix"+PathNetns, bytes.NewReader(body))
	if err != nil {
		return
	}
	hreq.Header.Set("Content-Type", "application/json")
	if resp, err := agentClient(socket, netnsTimeout).Do(hreq); err == nil {
		resp.Body.Close()
	}
}

// postAdd sends req to the agent. Every failure says the pod will be retried.
func postAdd(ctx context.Context, socket string, req AddRequest) (AddResponse, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return AddResponse{}, fmt.Errorf("ztunnel-cni: encode agent event: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://unix"+PathAdd, bytes.NewReader(body))
	if err != nil {
		return AddResponse{}, fmt.Errorf("ztunnel-cni: agent request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := agentClient(socket, AgentTimeout).Do(hreq)
	if err != nil {
		return AddResponse{}, fmt.Errorf("ztunnel-cni agent unreachable at %s: %w; the pod will be retried (no ambient pod starts uncaptured)", socket, err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return AddResponse{}, fmt.Errorf("ztunnel-cni agent at %s refused pod %s/%s: HTTP %d: %s; the pod will be retried (no ambient pod starts uncaptured)",
			socket, req.PodNamespace, req.PodName, resp.StatusCode, strings.TrimSpace(string(text)))
	}
	var out AddResponse
	if err := json.Unmarshal(text, &out); err != nil {
		// 200 is the agent's commitment; an unreadable body only costs the
		// log its "captured" detail.
		out.Captured = true
	}
	return out, nil
}
