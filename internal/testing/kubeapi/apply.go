package kubeapi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// FieldManager is the server-side apply field manager of Apply.
const FieldManager = "kubeapi-test"

// GatewayAPIModule is the module whose config/crd/standard/ ApplyCRDs
// applies; its version is the one the main go.mod requires.
const GatewayAPIModule = "sigs.k8s.io/gateway-api"

// IstioCRDDir is where the chart vendors the Istio CRDs ztunnel-go reads
// (deploy/update-crds.sh), relative to the repository root.
const IstioCRDDir = "deploy/chart/ztunnel-go/crds"

// ApplyOptions tunes Apply.
type ApplyOptions struct {
	// DryRun asks the server to validate and admit every object without
	// persisting it (dryRun=All).
	DryRun bool
	// Namespace is used for namespaced objects without metadata.namespace;
	// empty means "default".
	Namespace string
}

// Apply server-side applies every document of a multi-document YAML (or
// JSON) stream with Force, in order, as FieldManager. Empty documents and
// `List` kinds' items are handled; it stops at the first error, naming the
// object.
func (s *Server) Apply(ctx context.Context, manifests []byte, opts ApplyOptions) error {
	objs, err := DecodeObjects(manifests)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(s.Config())
	if err != nil {
		return fmt.Errorf("kubeapi: discovery: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn := s.Dynamic()
	ao := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	if opts.DryRun {
		ao.DryRun = []string{metav1.DryRunAll}
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			// A CRD applied earlier in the stream: refresh discovery.
			mapper.Reset()
			m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			return fmt.Errorf("kubeapi: apply %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		r := dyn.Resource(m.Resource)
		var ri dynamic.ResourceInterface = r
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = opts.Namespace
			}
			if ns == "" {
				ns = "default"
			}
			o.SetNamespace(ns)
			ri = r.Namespace(ns)
		}
		if _, err := ri.Apply(ctx, o.GetName(), o, ao); err != nil {
			return fmt.Errorf("kubeapi: apply %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}

// DecodeObjects splits a multi-document YAML or JSON stream into objects,
// skipping empty documents and expanding `kind: List`.
func DecodeObjects(manifests []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifests)))
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("kubeapi: read document %d: %w", i, err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("kubeapi: document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(j)) == 0 || string(bytes.TrimSpace(j)) == "null" {
			continue
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(j); err != nil {
			return nil, fmt.Errorf("kubeapi: document %d: %w", i, err)
		}
		if o.IsList() {
			l, err := o.ToList()
			if err != nil {
				return nil, fmt.Errorf("kubeapi: document %d: %w", i, err)
			}
			for k := range l.Items {
				objs = append(objs, &l.Items[k])
			}
			continue
		}
		objs = append(objs, o)
	}
}

// ApplyCRDs applies, server-side, the Istio CRDs the chart ships
// (IstioCRDDir: ServiceEntry, WorkloadEntry, AuthorizationPolicy,
// PeerAuthentication) and Gateway API's standard channel from the module
// cache, then waits until every CRD is Established.
func (s *Server) ApplyCRDs(ctx context.Context) error {
	istio, err := repoFile(IstioCRDDir)
	if err != nil {
		return err
	}
	gw, err := moduleDir(GatewayAPIModule)
	if err != nil {
		return err
	}
	var files []string
	for _, d := range []string{istio, filepath.Join(gw, "config", "crd", "standard")} {
		m, err := filepath.Glob(filepath.Join(d, "*.yaml"))
		if err != nil || len(m) == 0 {
			return fmt.Errorf("kubeapi: no CRD YAML in %s", d)
		}
		sort.Strings(m)
		files = append(files, m...)
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("kubeapi: %w", err)
		}
		objs, err := DecodeObjects(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, o := range objs {
			if o.GetKind() == "CustomResourceDefinition" {
				names = append(names, o.GetName())
			}
		}
		if err := s.Apply(ctx, b, ApplyOptions{}); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return s.WaitCRDsEstablished(ctx, names...)
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// WaitCRDsEstablished waits until each named CRD has the Established
// condition, so clients can use its kind right away.
func (s *Server) WaitCRDsEstablished(ctx context.Context, names ...string) error {
	dyn := s.Dynamic()
	for _, n := range names {
		for {
			o, err := dyn.Resource(crdGVR).Get(ctx, n, metav1.GetOptions{})
			if err == nil && crdEstablished(o) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("kubeapi: CRD %s not established: %w (last error: %v)", n, ctx.Err(), err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func crdEstablished(o *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
