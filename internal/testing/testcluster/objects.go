package testcluster

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster/kube"
)

// ServiceSpec describes a Service. Its EndpointSlice is derived from the
// running pods its Selector matches, as the endpointslice controller would.
type ServiceSpec struct {
	Name        string // required
	Namespace   string // "default" when empty
	Labels      map[string]string
	Annotations map[string]string
	// Selector picks the backing pods; nil means no selector and no
	// EndpointSlice.
	Selector map[string]string
	Ports    []kube.ServicePort
}

// Service is a Service of the cluster.
type Service struct {
	Name, Namespace string
	UID             string
	ClusterIP       netip.Addr // from ServiceCIDR; reachable only through the mesh
	spec            ServiceSpec
}

// AddNamespace creates or updates a Namespace object (labels replace the old
// ones) and rewrites the YAML.
func (c *Cluster) AddNamespace(name string, labels map[string]string) error {
	if name == "" {
		return errors.New("testcluster: AddNamespace: empty name")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ns := c.ensureNamespaceLocked(name)
	ns.Labels = maps.Clone(labels)
	return c.writeConfigLocked()
}

func (c *Cluster) ensureNamespaceLocked(name string) *kube.Namespace {
	ns, ok := c.namespaces[name]
	if !ok {
		ns = &kube.Namespace{Meta: kube.Meta{Name: name, UID: uid(c.id, "Namespace", "", name)}}
		c.namespaces[name] = ns
	}
	return ns
}

// AddService creates a Service with the next ClusterIP and rewrites the YAML.
func (c *Cluster) AddService(spec ServiceSpec) (*Service, error) {
	if spec.Name == "" {
		return nil, errors.New("testcluster: AddService: empty name")
	}
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	spec.Labels, spec.Annotations, spec.Selector = maps.Clone(spec.Labels), maps.Clone(spec.Annotations), maps.Clone(spec.Selector)
	spec.Ports = append([]kube.ServicePort(nil), spec.Ports...)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.services {
		if s.Namespace == spec.Namespace && s.Name == spec.Name {
			return nil, fmt.Errorf("testcluster: AddService: service %s/%s exists", spec.Namespace, spec.Name)
		}
	}
	s := &Service{
		Name:      spec.Name,
		Namespace: spec.Namespace,
		UID:       uid(c.id, "Service", spec.Namespace, spec.Name),
		ClusterIP: serviceIP(c.nextSvc),
		spec:      spec,
	}
	c.nextSvc++
	c.ensureNamespaceLocked(s.Namespace)
	c.services = append(c.services, s)
	return s, c.writeConfigLocked()
}

// Apply adds any other object to the YAML (an Istio AuthorizationPolicy,
// say), replacing one of the same kind, namespace and name.
func (c *Cluster) Apply(obj kube.Object) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.objects = replaceObject(c.objects, obj, true)
	return c.writeConfigLocked()
}

// Remove deletes an object added with Apply.
func (c *Cluster) Remove(obj kube.Object) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.objects = replaceObject(c.objects, obj, false)
	return c.writeConfigLocked()
}

func replaceObject(list []kube.Object, obj kube.Object, add bool) []kube.Object {
	_, kind := obj.GVK()
	m := obj.ObjectMeta()
	out := list[:0]
	for _, o := range list {
		_, k := o.GVK()
		om := o.ObjectMeta()
		if k == kind && om.Namespace == m.Namespace && om.Name == m.Name {
			continue
		}
		out = append(out, o)
	}
	if add {
		out = append(out, obj)
	}
	return out
}

// Objects returns the cluster as Kubernetes objects: namespaces, pods,
// services, their EndpointSlices and Apply'd objects.
func (c *Cluster) Objects() []kube.Object {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.objectsLocked()
}

func (c *Cluster) objectsLocked() []kube.Object {
	var out []kube.Object
	for _, ns := range c.namespaces {
		cp := *ns
		cp.Labels = maps.Clone(ns.Labels)
		out = append(out, &cp)
	}
	var running []*kube.Pod
	for _, p := range c.pods {
		if p.deleted {
			continue
		}
		kp := &kube.Pod{
			Meta: kube.Meta{
				Name: p.Name, Namespace: p.Namespace, UID: p.UID,
				Labels: maps.Clone(p.labels), Annotations: maps.Clone(p.annotations),
			},
			NodeName:       p.Node.Name,
			ServiceAccount: p.ServiceAccount,
			HostNetwork:    p.HostNetwork,
			Containers:     p.containers,
			Phase:          kube.PodPending,
			HostIP:         p.Node.UnderlayIP,
		}
		if p.running {
			kp.Phase, kp.Ready, kp.IPs = kube.PodRunning, true, []netip.Addr{p.IP}
			running = append(running, kp)
		}
		out = append(out, kp)
	}
	for _, s := range c.services {
		out = append(out, &kube.Service{
			Meta: kube.Meta{
				Name: s.Name, Namespace: s.Namespace, UID: s.UID,
				Labels: maps.Clone(s.spec.Labels), Annotations: maps.Clone(s.spec.Annotations),
			},
			ClusterIP: s.ClusterIP,
			Selector:  maps.Clone(s.spec.Selector),
			Ports:     s.spec.Ports,
		})
		if s.spec.Selector != nil {
			out = append(out, endpointSlice(c.id, s, running))
		}
	}
	return append(out, c.objects...)
}

// endpointSlice is what the endpointslice controller would publish for s:
// every running pod in s's namespace matching its selector, with target
// ports resolved (named ports through the pod's containers).
func endpointSlice(id string, s *Service, pods []*kube.Pod) *kube.EndpointSlice {
	name := s.Name + "-ztg"
	es := &kube.EndpointSlice{
		Meta:        kube.Meta{Name: name, Namespace: s.Namespace, UID: uid(id, "EndpointSlice", s.Namespace, name)},
		ServiceName: s.Name,
	}
	var backends []*kube.Pod
	for _, p := range pods {
		if p.Namespace == s.Namespace && matches(s.spec.Selector, p.Labels) {
			backends = append(backends, p)
		}
	}
	for _, sp := range s.spec.Ports {
		port := sp.TargetPort
		if port == 0 {
			port = sp.Port
		}
		if sp.TargetPortName != "" {
			// Kubernetes resolves a named port per pod; test pods of one
			// service share their port names, so the first match decides.
			port = 0
			for _, p := range backends {
				if port = namedPort(p, sp.TargetPortName); port != 0 {
					break
				}
			}
			if port == 0 {
				continue
			}
		}
		es.Ports = append(es.Ports, kube.EndpointPort{Name: sp.Name, Port: port, Protocol: sp.Protocol})
	}
	for _, p := range backends {
		es.Endpoints = append(es.Endpoints, kube.Endpoint{
			Address:   p.IPs[0],
			NodeName:  p.NodeName,
			Ready:     true,
			TargetRef: kube.Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	return es
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func namedPort(p *kube.Pod, name string) int {
	for _, c := range p.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return cp.Port
			}
		}
	}
	return 0
}

// WriteConfig writes a snapshot of the cluster's YAML into dir (which it
// owns, see kube.WriteDir). ConfigDir is kept current without calling this.
func (c *Cluster) WriteConfig(dir string) error {
	return kube.WriteDir(dir, c.Objects())
}

func (c *Cluster) writeConfig() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeConfigLocked()
}

func (c *Cluster) writeConfigLocked() error {
	if err := kube.WriteDir(c.configDir, c.objectsLocked()); err != nil {
		return fmt.Errorf("testcluster: writing %s: %w", c.configDir, err)
	}
	return nil
}
