// Package kube holds small typed builders for the ordinary Kubernetes objects
// a test cluster needs (Namespace, Pod, Service, EndpointSlice, plus Raw for
// anything else such as Istio policies) and writes them as readable
// multi-document YAML, the input of the control plane's local mode.
//
// It is not a Kubernetes client and does not import k8s.io/api: the structs
// carry only the fields the mesh reads, and the tests prove the output decodes
// strictly into the real API types.
package kube

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Object is one Kubernetes object.
type Object interface {
	// GVK returns apiVersion and kind, e.g. "v1", "Pod".
	GVK() (apiVersion, kind string)
	// ObjectMeta returns the object's metadata.
	ObjectMeta() Meta
	// body returns the top-level fields after metadata (spec, status, ...).
	body() Map
}

// Meta is the subset of ObjectMeta the mesh reads. Namespace is empty for
// cluster-scoped objects.
type Meta struct {
	Name        string
	Namespace   string
	UID         string
	Labels      map[string]string
	Annotations map[string]string
}

func (m Meta) yaml() Map {
	return Map{
		{"name", m.Name},
		{"namespace", m.Namespace},
		{"uid", m.UID},
		{"labels", m.Labels},
		{"annotations", m.Annotations},
	}
}

// Namespace is a core/v1 Namespace.
type Namespace struct{ Meta }

func (n *Namespace) GVK() (string, string) { return "v1", "Namespace" }
func (n *Namespace) ObjectMeta() Meta      { return n.Meta }
func (n *Namespace) body() Map {
	return Map{{"status", Map{{"phase", "Active"}}}}
}

// Pod phases.
const (
	PodPending = "Pending"
	PodRunning = "Running"
)

// Pod is a core/v1 Pod as a kubelet would report it.
type Pod struct {
	Meta
	NodeName       string
	ServiceAccount string // spec.serviceAccountName; empty means "default"
	HostNetwork    bool
	Containers     []Container // one container "app" when empty
	Phase          string      // PodPending or PodRunning; empty means PodPending
	Ready          bool        // the Ready condition
	HostIP         netip.Addr  // status.hostIP(s); zero omits it
	IPs            []netip.Addr
}

// Container is a pod container; only its name, image and ports matter here.
type Container struct {
	Name  string
	Image string
	Ports []ContainerPort
}

// ContainerPort is a named container port, for Services with a named
// targetPort.
type ContainerPort struct {
	Name     string
	Port     int
	Protocol string // "TCP" when empty
}

func (p *Pod) GVK() (string, string) { return "v1", "Pod" }
func (p *Pod) ObjectMeta() Meta      { return p.Meta }
func (p *Pod) body() Map {
	sa := p.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	containers := p.Containers
	if len(containers) == 0 {
		containers = []Container{{Name: "app"}}
	}
	var cs []any
	for _, c := range containers {
		img := c.Image
		if img == "" {
			img = "testcluster/" + c.Name
		}
		var ports []any
		for _, cp := range c.Ports {
			ports = append(ports, Map{{"name", cp.Name}, {"containerPort", cp.Port}, {"protocol", orTCP(cp.Protocol)}})
		}
		cs = append(cs, Map{{"name", c.Name}, {"image", img}, {"ports", ports}})
	}
	spec := Map{
		{"nodeName", p.NodeName},
		{"serviceAccountName", sa},
		{"containers", cs},
	}
	if p.HostNetwork {
		spec = append(spec, KV{"hostNetwork", true})
	}
	phase := p.Phase
	if phase == "" {
		phase = PodPending
	}
	ready := "False"
	if p.Ready {
		ready = "True"
	}
	status := Map{
		{"phase", phase},
		{"conditions", []any{Map{{"type", "Ready"}, {"status", ready}}}},
	}
	if p.HostIP.IsValid() {
		status = append(status,
			KV{"hostIP", p.HostIP},
			KV{"hostIPs", []any{Map{{"ip", p.HostIP}}}})
	}
	if len(p.IPs) > 0 {
		var ips []any
		for _, ip := range p.IPs {
			ips = append(ips, Map{{"ip", ip}})
		}
		status = append(status, KV{"podIP", p.IPs[0]}, KV{"podIPs", ips})
	}
	return Map{{"spec", spec}, {"status", status}}
}

func orTCP(proto string) string {
	if proto == "" {
		return "TCP"
	}
	return proto
}

// Service is a core/v1 Service of type ClusterIP.
type Service struct {
	Meta
	ClusterIP netip.Addr        // zero means headless ("None")
	Selector  map[string]string // nil: no selector (endpoints come from elsewhere)
	Ports     []ServicePort
}

// ServicePort is one service port. TargetPort is a number, or a container
// port name when TargetPortName is set; 0 and empty mean "same as Port".
type ServicePort struct {
	Name           string
	Port           int
	TargetPort     int
	TargetPortName string
	Protocol       string // "TCP" when empty
	AppProtocol    string
}

func (s *Service) GVK() (string, string) { return "v1", "Service" }
func (s *Service) ObjectMeta() Meta      { return s.Meta }
func (s *Service) body() Map {
	ip := "None"
	if s.ClusterIP.IsValid() {
		ip = s.ClusterIP.String()
	}
	var ports []any
	for _, p := range s.Ports {
		var target any = p.TargetPort
		if p.TargetPortName != "" {
			target = p.TargetPortName
		} else if p.TargetPort == 0 {
			target = p.Port
		}
		ports = append(ports, Map{
			{"name", p.Name},
			{"protocol", orTCP(p.Protocol)},
			{"appProtocol", p.AppProtocol},
			{"port", p.Port},
			{"targetPort", target},
		})
	}
	return Map{{"spec", Map{
		{"type", "ClusterIP"},
		{"clusterIP", ip},
		{"clusterIPs", []string{ip}},
		{"selector", s.Selector},
		{"ports", ports},
	}}}
}

// EndpointSlice is a discovery.k8s.io/v1 EndpointSlice (IPv4).
type EndpointSlice struct {
	Meta
	ServiceName string // sets the kubernetes.io/service-name label
	Ports       []EndpointPort
	Endpoints   []Endpoint
}

// EndpointPort is a resolved (numeric) endpoint port.
type EndpointPort struct {
	Name     string
	Port     int
	Protocol string // "TCP" when empty
}

// Endpoint is one backend of a slice.
type Endpoint struct {
	Address  netip.Addr
	NodeName string
	Ready    bool
	// TargetRef names the pod behind the endpoint; empty Name omits it.
	TargetRef Ref
}

// Ref is an object reference.
type Ref struct {
	Kind, Namespace, Name, UID string
}

func (e *EndpointSlice) GVK() (string, string) { return "discovery.k8s.io/v1", "EndpointSlice" }
func (e *EndpointSlice) ObjectMeta() Meta {
	m := e.Meta
	if e.ServiceName != "" {
		labels := make(map[string]string, len(m.Labels)+1)
		for k, v := range m.Labels {
			labels[k] = v
		}
		labels["kubernetes.io/service-name"] = e.ServiceName
		m.Labels = labels
	}
	return m
}
func (e *EndpointSlice) body() Map {
	var ports []any
	for _, p := range e.Ports {
		ports = append(ports, Map{{"name", p.Name}, {"protocol", orTCP(p.Protocol)}, {"port", p.Port}})
	}
	var eps []any
	for _, ep := range e.Endpoints {
		m := Map{
			{"addresses", []string{ep.Address.String()}},
			{"conditions", Map{{"ready", ep.Ready}}},
			{"nodeName", ep.NodeName},
		}
		if ep.TargetRef.Name != "" {
			m = append(m, KV{"targetRef", Map{
				{"kind", ep.TargetRef.Kind},
				{"namespace", ep.TargetRef.Namespace},
				{"name", ep.TargetRef.Name},
				{"uid", ep.TargetRef.UID},
			}})
		}
		eps = append(eps, m)
	}
	return Map{{"addressType", "IPv4"}, {"ports", ports}, {"endpoints", eps}}
}

// Raw is any other object, e.g. an Istio AuthorizationPolicy. Fields are the
// top-level fields after metadata (usually just "spec"). Values may be Map
// (ordered), map[string]any / map[string]string (sorted keys), []any, []string
// and scalars; unlike the typed objects, empty values are written ({}, [],
// "", null), because in policies `from: [{source: {}}]` means something.
type Raw struct {
	APIVersion string
	Kind       string
	Meta
	Fields Map
}

func (r *Raw) GVK() (string, string) { return r.APIVersion, r.Kind }
func (r *Raw) ObjectMeta() Meta      { return r.Meta }
func (r *Raw) body() Map {
	out := make(Map, len(r.Fields))
	for i, kv := range r.Fields {
		out[i] = KV{kv.Key, KeepEmpty{kv.Value}}
	}
	return out
}

// Marshal writes objs as one multi-document YAML stream, in the given order.
func Marshal(objs ...Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		if i > 0 {
			buf.WriteString("---\n")
		}
		api, kind := o.GVK()
		doc := Map{{"apiVersion", api}, {"kind", kind}, {"metadata", o.ObjectMeta().yaml()}}
		doc = append(doc, o.body()...)
		if err := encodeYAML(&buf, doc); err != nil {
			m := o.ObjectMeta()
			return nil, fmt.Errorf("kube: %s %s/%s: %w", kind, m.Namespace, m.Name, err)
		}
	}
	return buf.Bytes(), nil
}

// FileName is the file WriteDir puts objects of kind into, e.g.
// "pod.yaml", "authorizationpolicy.yaml".
func FileName(kind string) string { return strings.ToLower(kind) + ".yaml" }

// Render groups objs by kind, sorts each group by namespace/name and returns
// the content of each file WriteDir would write.
func Render(objs []Object) (map[string][]byte, error) {
	byFile := map[string][]Object{}
	for _, o := range objs {
		_, kind := o.GVK()
		f := FileName(kind)
		byFile[f] = append(byFile[f], o)
	}
	out := make(map[string][]byte, len(byFile))
	for f, group := range byFile {
		sort.SliceStable(group, func(i, j int) bool {
			a, b := group[i].ObjectMeta(), group[j].ObjectMeta()
			if a.Namespace != b.Namespace {
				return a.Namespace < b.Namespace
			}
			return a.Name < b.Name
		})
		data, err := Marshal(group...)
		if err != nil {
			return nil, err
		}
		out[f] = data
	}
	return out, nil
}

// WriteDir writes objs into dir, one file per kind (see FileName). Each file
// is replaced atomically (write to a dot-file, then rename), so a watcher
// never reads half a file; *.yaml files of kinds no longer present are
// removed. dir must be owned by the caller: other *.yaml files in it are
// deleted.
func WriteDir(dir string, objs []Object) error {
	files, err := Render(objs)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if err := writeAtomic(filepath.Join(dir, f), files[f]); err != nil {
			return err
		}
	}
	old, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	for _, p := range old {
		if _, keep := files[filepath.Base(p)]; !keep {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("kube: %w", err)
			}
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil // unchanged: do not wake watchers
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("kube: write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("kube: rename %s: %w", path, err)
	}
	return nil
}
