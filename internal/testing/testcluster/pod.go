package testcluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// PodSpec describes a pod to add to a node.
type PodSpec struct {
	Name      string // required
	Namespace string // "default" when empty; created (unlabelled) if new
	Labels    map[string]string
	// Annotations go on the pod object as given.
	Annotations map[string]string
	// ServiceAccount is spec.serviceAccountName; "default" when empty.
	ServiceAccount string
	// Containers only matter for named ports; one container "app" when nil.
	Containers []kube.Container
	// HostNetwork runs the pod in its node's namespace with the node's IP;
	// no CNI is involved (as with kubelet).
	HostNetwork bool
	// UID replaces the pod's derived UID (K8S_POD_UID of its CNI ADD), e.g.
	// with the UID an API server gave the pod's object.
	UID string
	// Uncaptured wires the pod through the node's plain network (bridge and
	// loopback, no extra plugins), as if the mesh's CNI plugin were not
	// installed: a pod the mesh never hears about from CNI. Its object is
	// still in the YAML, like any pod of a real cluster.
	Uncaptured bool
}

// Pod is a pod of the cluster. Its embedded NetNS is the pod's own namespace
// (the node's for host-network pods).
type Pod struct {
	*NetNS
	Name, Namespace string
	UID             string
	Node            *Node
	// Index is the pod's number on its node (its IP is 10.31.<node>.<10+Index>);
	// -1 for host-network pods.
	Index          int
	IP             netip.Addr // fixed at creation, also while pending
	ServiceAccount string
	HostNetwork    bool
	Uncaptured     bool

	c          *Cluster
	containers []kube.Container
	// Guarded by c.mu.
	labels, annotations map[string]string
	running             bool
	deleted             bool
}

// CNIError is a failed cnitool run. Output holds what cnitool and the
// plugins printed (the CNI error JSON, usually).
type CNIError struct {
	Op     string // "ADD" or "DEL"
	Pod    string // namespace/name
	Output string
	Err    error
}

func (e *CNIError) Error() string {
	return fmt.Sprintf("testcluster: CNI %s %s: %v: %s", e.Op, e.Pod, e.Err, strings.TrimSpace(e.Output))
}

func (e *CNIError) Unwrap() error { return e.Err }

// AddPod creates a pod on n the way kubelet does: the pod object appears in
// the YAML as Pending (no IP), its namespace is created and CNI ADD runs;
// on success the object becomes Running and Ready with its IP.
//
// If CNI ADD fails (say the mesh agent is down), AddPod runs CNI DEL and
// removes the namespace, as a runtime does for a failed sandbox, and returns
// the still-Pending pod together with a *CNIError; p.Retry tries again. For
// any other error the pod is nil.
func (n *Node) AddPod(ctx context.Context, spec PodSpec) (*Pod, error) {
	c := n.c
	if spec.Name == "" {
		return nil, errors.New("testcluster: AddPod: empty name")
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if spec.HostNetwork && spec.Uncaptured {
		return nil, errors.New("testcluster: AddPod: HostNetwork and Uncaptured exclude each other")
	}
	p := &Pod{
		Name:           spec.Name,
		Namespace:      spec.Namespace,
		UID:            cmp.Or(spec.UID, uid(c.id, "Pod", spec.Namespace, spec.Name)),
		Node:           n,
		ServiceAccount: spec.ServiceAccount,
		HostNetwork:    spec.HostNetwork,
		Uncaptured:     spec.Uncaptured,
		c:              c,
		containers:     spec.Containers,
		labels:         maps.Clone(spec.Labels),
		annotations:    maps.Clone(spec.Annotations),
	}
	c.mu.Lock()
	for _, q := range c.pods {
		if !q.deleted && q.Namespace == p.Namespace && q.Name == p.Name {
			c.mu.Unlock()
			return nil, fmt.Errorf("testcluster: AddPod: pod %s/%s exists", p.Namespace, p.Name)
		}
	}
	if spec.HostNetwork {
		p.Index, p.IP, p.NetNS, p.running = -1, n.UnderlayIP, n.NetNS, true
	} else {
		switch {
		case len(n.freePods) > 0:
			// A deleted pod's number (address, namespace name), as a
			// node's IPAM reuses addresses: churning tests create many
			// more pods over time than a node holds at once.
			p.Index = n.freePods[len(n.freePods)-1]
			n.freePods = n.freePods[:len(n.freePods)-1]
		case n.nextPod >= MaxPodsPerNode:
			c.mu.Unlock()
			return nil, fmt.Errorf("testcluster: AddPod: node %s is full (%d pods)", n.Name, MaxPodsPerNode)
		default:
			p.Index = n.nextPod
			n.nextPod++
		}
		p.IP = podIP(n.Index, p.Index)
		p.NetNS = &NetNS{c: c, name: podNS(c.id, n.Index, p.Index)}
	}
	c.ensureNamespaceLocked(p.Namespace)
	c.pods = append(c.pods, p)
	err := c.writeConfigLocked()
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if spec.HostNetwork {
		return p, nil
	}
	if err := p.NetNS.create(); err != nil {
		return nil, fmt.Errorf("testcluster: pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return p, p.sandbox(ctx)
}

// Retry re-runs sandbox creation for a pod whose CNI ADD failed: a fresh
// namespace and CNI ADD. It is a no-op for a running pod.
func (p *Pod) Retry(ctx context.Context) error {
	p.c.mu.Lock()
	running, deleted := p.running, p.deleted
	p.c.mu.Unlock()
	switch {
	case deleted:
		return fmt.Errorf("testcluster: retry %s/%s: pod deleted", p.Namespace, p.Name)
	case running:
		return nil
	}
	if err := p.NetNS.create(); err != nil {
		return fmt.Errorf("testcluster: pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return p.sandbox(ctx)
}

// sandbox runs CNI ADD in the fresh namespace and publishes the result.
func (p *Pod) sandbox(ctx context.Context) error {
	if err := p.cniAdd(ctx); err != nil {
		// Like a runtime tearing down a failed sandbox: DEL, then drop the
		// namespace. A DEL failure is reported with the ADD failure. The DEL
		// gets its own deadline: ctx may be what ended the ADD.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		derr := p.cniDel(dctx)
		cancel()
		if nerr := p.NetNS.destroy(); nerr != nil {
			derr = errors.Join(derr, nerr)
		}
		if derr != nil {
			var ce *CNIError
			if errors.As(err, &ce) {
				ce.Err = errors.Join(ce.Err, fmt.Errorf("cleanup after failed ADD: %w", derr))
			}
		}
		return err
	}
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	p.running = true
	return p.c.writeConfigLocked()
}

// Running reports whether the pod's sandbox is up (CNI ADD succeeded).
func (p *Pod) Running() bool {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.running && !p.deleted
}

// Labels returns a copy of the pod's labels.
func (p *Pod) Labels() map[string]string {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return maps.Clone(p.labels)
}

// SetLabels replaces the pod's labels and rewrites the YAML.
func (p *Pod) SetLabels(labels map[string]string) error {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	p.labels = maps.Clone(labels)
	return p.c.writeConfigLocked()
}

// SetAnnotations replaces the pod's annotations and rewrites the YAML.
func (p *Pod) SetAnnotations(annotations map[string]string) error {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	p.annotations = maps.Clone(annotations)
	return p.c.writeConfigLocked()
}

// Delete removes the pod as kubelet does: CNI DEL, namespace removal, then
// the object disappears from the YAML. Processes a test started in the pod
// should be stopped first.
func (p *Pod) Delete(ctx context.Context) error {
	p.c.mu.Lock()
	if p.deleted {
		p.c.mu.Unlock()
		return nil
	}
	p.deleted = true
	p.c.mu.Unlock()
	var errs []error
	reusable := false
	if !p.HostNetwork {
		var delErr error
		if _, err := p.Handle(); err == nil {
			delErr = p.cniDel(ctx)
		}
		nsErr := p.NetNS.destroy()
		errs = append(errs, delErr, nsErr)
		reusable = delErr == nil && nsErr == nil
	}
	p.c.mu.Lock()
	if reusable {
		// Gone for good: its number may serve the next pod, and the
		// cluster forgets it (its cleanup has nothing left to undo).
		p.Node.freePods = append(p.Node.freePods, p.Index)
		p.c.pods = slices.DeleteFunc(p.c.pods, func(q *Pod) bool { return q == p })
	}
	errs = append(errs, p.c.writeConfigLocked())
	p.c.mu.Unlock()
	return errors.Join(errs...)
}

func (p *Pod) network() string {
	if p.Uncaptured {
		return netNamePlain
	}
	return netName
}

// cniAdd runs `cnitool add` inside the node's namespace (the bridge plugin
// creates the host end of the veth in the namespace it runs in) and checks
// that the pod got its planned address.
func (p *Pod) cniAdd(ctx context.Context) error {
	out, err := p.cnitool(ctx, "add")
	if err != nil {
		return &CNIError{Op: "ADD", Pod: p.Namespace + "/" + p.Name, Output: string(out), Err: err}
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return &CNIError{Op: "ADD", Pod: p.Namespace + "/" + p.Name, Output: string(out), Err: fmt.Errorf("parsing result: %w", err)}
	}
	for _, ip := range res.IPs {
		if pfx, err := netip.ParsePrefix(ip.Address); err == nil && pfx.Addr() == p.IP {
			return nil
		}
	}
	return &CNIError{Op: "ADD", Pod: p.Namespace + "/" + p.Name, Output: string(out),
		Err: fmt.Errorf("result lacks the planned address %s", p.IP)}
}

func (p *Pod) cniDel(ctx context.Context) error {
	out, err := p.cnitool(ctx, "del")
	if err != nil {
		return &CNIError{Op: "DEL", Pod: p.Namespace + "/" + p.Name, Output: string(out), Err: err}
	}
	return nil
}

// cnitool runs `ip netns exec <node> cnitool <op> <net> <pod netns>` with the
// CNI arguments containerd passes for a Kubernetes pod. stdout is the CNI
// result; on failure the returned bytes hold stdout and stderr.
func (p *Pod) cnitool(ctx context.Context, op string) ([]byte, error) {
	c := p.c
	capArgs, _ := json.Marshal(map[string]any{"ips": []string{netip.PrefixFrom(p.IP, p.Node.PodCIDR.Bits()).String()}})
	env := []string{
		"NETCONFPATH=" + p.Node.CNIConfDir,
		"CNI_PATH=" + c.cniPath,
		"CNI_IFNAME=eth0",
		"CNI_ARGS=" + strings.Join([]string{
			"IgnoreUnknown=1",
			"K8S_POD_NAMESPACE=" + p.Namespace,
			"K8S_POD_NAME=" + p.Name,
			"K8S_POD_UID=" + p.UID,
		}, ";"),
		"CAP_ARGS=" + string(capArgs),
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "CNI_") && k != "NETCONFPATH" && k != "CAP_ARGS" {
			env = append(env, kv)
		}
	}
	cmd := exec.CommandContext(ctx, c.ipPath, "netns", "exec", p.Node.name, c.cnitool, op, p.network(), p.NetNSPath())
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return []byte(stdout.String() + stderr.String()), err
	}
	return []byte(stdout.String()), nil
}
