package meshlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// Waypoint Gateways (what Istio's gateway controller reads).
const (
	waypointClass     = "istio-waypoint"
	labelGatewayName  = "gateway.networking.k8s.io/gateway-name"
	gatewayAPIVersion = "gateway.networking.k8s.io/"
)

// LoadYAML applies a file, or every *.yaml file of a directory (in name
// order), of ordinary Kubernetes YAML the way a cluster would run it:
//
//   - Namespaces, Services and Pods become objects of the testcluster
//     (which keeps their YAML with the status a cluster would write:
//     ClusterIPs, EndpointSlices, pod IPs). A Pod needs spec.nodeName
//     ("node0", "node1", ...); it is created through CNI on that node, so
//     the mesh's plugin and agent decide whether it is captured, and it runs
//     an echo server on each TCP containerPort (see ServeEcho).
//   - A Gateway of class istio-waypoint gets status.addresses = the
//     ClusterIP of the Service of the same name and namespace, as Istio's
//     gateway controller does for the waypoint Service it creates.
//   - Everything else (AuthorizationPolicy, PeerAuthentication,
//     ServiceEntry, ...) is written as it is next to the cluster's YAML.
//
// It returns once every new pod runs and every node proxy's state holds
// it.
func (m *Mesh) LoadYAML(ctx context.Context, path string) error {
	files, err := yamlFiles(path)
	if err != nil {
		return err
	}
	var pods []*corev1.Pod
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("meshlab: %w", err)
		}
		p, err := m.applyDocs(filepath.Base(f), data)
		if err != nil {
			return err
		}
		pods = append(pods, p...)
	}
	var ips []netip.Addr
	for _, p := range pods {
		tp, err := m.addPodObject(ctx, p)
		if err != nil {
			return err
		}
		ips = append(ips, tp.IP)
	}
	if err := m.SyncKubeProxy(); err != nil {
		return err
	}
	return m.WaitForWorkloads(ctx, ips...)
}

func yamlFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("meshlab: %w", err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	files, err := filepath.Glob(filepath.Join(path, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("meshlab: %w", err)
	}
	sort.Strings(files)
	return files, nil
}

// applyDocs applies the documents of one file except Pods, which it returns
// (they are created once every Service exists).
func (m *Mesh) applyDocs(name string, data []byte) ([]*corev1.Pod, error) {
	var pods []*corev1.Pod
	var rest [][]byte
	for i, doc := range cluster.SplitDocuments(data) {
		if doc == nil {
			continue
		}
		// Strict decoding first: a typo names file, document and field.
		var objs cluster.Objects
		if errs := cluster.Decode(name, doc, &objs); len(errs) > 0 {
			return nil, fmt.Errorf("meshlab: %s document %d: %w", name, i, errors.Join(errs...))
		}
		switch {
		case len(objs.Namespaces) == 1:
			ns := objs.Namespaces[0]
			if err := m.Cluster.AddNamespace(ns.Name, ns.Labels); err != nil {
				return nil, err
			}
		case len(objs.Services) == 1:
			if err := m.addServiceObject(objs.Services[0]); err != nil {
				return nil, err
			}
		case len(objs.Pods) == 1:
			pods = append(pods, objs.Pods[0])
		case len(objs.Gateways) == 1 && string(objs.Gateways[0].Spec.GatewayClassName) == waypointClass:
			out, err := m.waypointGateway(doc, objs.Gateways[0].Namespace, objs.Gateways[0].Name)
			if err != nil {
				return nil, fmt.Errorf("meshlab: %s document %d: %w", name, i, err)
			}
			rest = append(rest, out)
		default:
			rest = append(rest, doc)
		}
	}
	if len(rest) > 0 {
		if err := m.Apply(name, bytes.Join(rest, []byte("\n---\n"))); err != nil {
			return nil, err
		}
	}
	return pods, nil
}

func (m *Mesh) addServiceObject(s *corev1.Service) error {
	spec := testcluster.ServiceSpec{
		Name: s.Name, Namespace: s.Namespace, Labels: s.Labels, Annotations: s.Annotations,
		Selector: s.Spec.Selector,
	}
	for _, p := range s.Spec.Ports {
		sp := kube.ServicePort{Name: p.Name, Port: int(p.Port), Protocol: string(p.Protocol)}
		if p.AppProtocol != nil {
			sp.AppProtocol = *p.AppProtocol
		}
		if p.TargetPort.IntValue() != 0 {
			sp.TargetPort = p.TargetPort.IntValue()
		} else if p.TargetPort.StrVal != "" {
			sp.TargetPortName = p.TargetPort.StrVal
		}
		spec.Ports = append(spec.Ports, sp)
	}
	_, err := m.Cluster.AddService(spec)
	return err
}

// addPodObject creates a Pod of the YAML on its spec.nodeName.
func (m *Mesh) addPodObject(ctx context.Context, p *corev1.Pod) (*testcluster.Pod, error) {
	idx, err := nodeIndex(p.Spec.NodeName, len(m.Nodes))
	if err != nil {
		return nil, fmt.Errorf("meshlab: pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	spec := testcluster.PodSpec{
		Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, Annotations: p.Annotations,
		ServiceAccount: p.Spec.ServiceAccountName,
	}
	for _, c := range p.Spec.Containers {
		kc := kube.Container{Name: c.Name, Image: c.Image}
		for _, cp := range c.Ports {
			kc.Ports = append(kc.Ports, kube.ContainerPort{Name: cp.Name, Port: int(cp.ContainerPort), Protocol: string(cp.Protocol)})
		}
		spec.Containers = append(spec.Containers, kc)
	}
	return m.AddPod(ctx, idx, spec)
}

func nodeIndex(name string, nodes int) (int, error) {
	s, ok := strings.CutPrefix(name, "node")
	i, err := strconv.Atoi(s)
	if !ok || err != nil || i < 0 || i >= nodes {
		return 0, fmt.Errorf("spec.nodeName %q: want node0..node%d", name, nodes-1)
	}
	return i, nil
}

// waypointGateway returns the Gateway document with status.addresses set to
// the ClusterIP of its Service (same namespace and name).
func (m *Mesh) waypointGateway(doc []byte, ns, name string) ([]byte, error) {
	var svcIP netip.Addr
	for _, o := range m.Cluster.Objects() {
		if s, ok := o.(*kube.Service); ok && s.Namespace == ns && s.Name == name {
			svcIP = s.ClusterIP
		}
	}
	if !svcIP.IsValid() {
		return nil, fmt.Errorf("waypoint Gateway %s/%s: no Service %s/%s (the waypoint's own Service, listed before the Gateway) to take the address from", ns, name, ns, name)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(doc, &obj); err != nil {
		return nil, err
	}
	obj["status"] = map[string]any{"addresses": []any{map[string]any{"type": "IPAddress", "value": svcIP.String()}}}
	return yaml.Marshal(obj)
}

// Apply writes YAML (one or more documents) as user/<name>.yaml under the
// config root: the control plane and the agents pick it up within their
// poll interval (200 ms). Applying the same name again replaces it.
func (m *Mesh) Apply(name string, data []byte) error {
	p, err := m.userPath(name)
	if err != nil {
		return err
	}
	tmp := filepath.Join(m.userDir, ".tmp-"+filepath.Base(p))
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("meshlab: %w", err)
	}
	return nil
}

// Remove deletes what Apply wrote under name.
func (m *Mesh) Remove(name string) error {
	p, err := m.userPath(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("meshlab: %w", err)
	}
	return nil
}

func (m *Mesh) userPath(name string) (string, error) {
	base := strings.TrimSuffix(filepath.Base(name), ".yaml")
	if base == "" || base == "." || strings.HasPrefix(base, ".") {
		return "", fmt.Errorf("meshlab: bad YAML name %q", name)
	}
	return filepath.Join(m.userDir, base+".yaml"), nil
}

// AddPod creates a pod on node i through CNI (captured or not as the mesh's
// plugin decides), runs an echo server on each TCP container port, and
// keeps the kube-proxy rules current. It does not wait for the node
// proxies' state; see WaitForWorkloads.
func (m *Mesh) AddPod(ctx context.Context, node int, spec testcluster.PodSpec) (*testcluster.Pod, error) {
	if node < 0 || node >= len(m.Nodes) {
		return nil, fmt.Errorf("meshlab: AddPod %s: no node %d", spec.Name, node)
	}
	p, err := m.Nodes[node].AddPod(ctx, spec)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.pods[p.Namespace+"/"+p.Name] = p
	m.mu.Unlock()
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			if cp.Protocol == "" || cp.Protocol == "TCP" {
				if err := m.ServeEcho(p, cp.Port); err != nil {
					return nil, err
				}
			}
		}
	}
	return p, m.SyncKubeProxy()
}

// Pod returns the pod namespace/name created through the mesh, or nil.
func (m *Mesh) Pod(namespace, name string) *testcluster.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods[namespace+"/"+name]
}

// Service returns the ClusterIP of Service namespace/name (invalid if
// there is none).
func (m *Mesh) Service(namespace, name string) netip.Addr {
	for _, o := range m.Cluster.Objects() {
		if s, ok := o.(*kube.Service); ok && s.Namespace == namespace && s.Name == name {
			return s.ClusterIP
		}
	}
	return netip.Addr{}
}
