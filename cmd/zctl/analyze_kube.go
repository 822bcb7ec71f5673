package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// codeKindNotServed: a kind the control plane watches that the API server
// does not serve (its CRD is missing: ztunnel-cp never becomes ready).
const codeKindNotServed = "ZTG0012"

// analyzeCluster reads the live cluster (kubeconfig, or the pod's service
// account when "") and analyzes it as a YAML directory is analyzed.
func analyzeCluster(kubeconfig string, pods []agentPod) ([]finding, string, error) {
	var (
		rc  *rest.Config
		err error
	)
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, "", fmt.Errorf("in-cluster configuration (give --kubeconfig outside a pod): %w", err)
		}
	} else if rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	rc.Timeout = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	source := "API server " + rc.Host
	objs, decodeErrs, missing, err := clusterObjects(ctx, rc)
	if err != nil {
		return nil, source, err
	}
	fs := analyzeObjects(objs, source, decodeErrs, pods)
	for _, k := range missing {
		fs = append(fs, finding{Code: codeKindNotServed, Level: levelError, Object: k.Name + " (" + k.GroupVersion.String() + ")",
			Message: "the API server does not serve " + k.Resource + ": ztunnel-cp watches it and never becomes ready without it",
			Fix:     crdFix(k.GroupVersion.String())})
	}
	return fs, source, nil
}

// clusterObjects lists, from the API server rc points at, every object of
// the kinds the control plane reads (cluster.Kinds) and of the kinds it
// ignores but reports (cluster.IgnoredKinds), and decodes them with local
// mode's own decoder (cluster.Decode), so that the live cluster and a YAML
// directory of the same objects give the same findings. missing are the
// read kinds the API server does not serve.
func clusterObjects(ctx context.Context, rc *rest.Config) (*cluster.Objects, []error, []cluster.Kind, error) {
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("API server %s: %w", rc.Host, err)
	}
	disc := kc.Discovery()
	served := map[schema.GroupVersion]map[string]string{} // resource → kind; nil: group version not served
	resources := func(gv schema.GroupVersion) (map[string]string, error) {
		if m, ok := served[gv]; ok {
			return m, nil
		}
		list, err := disc.ServerResourcesForGroupVersion(gv.String())
		if apierrors.IsNotFound(err) {
			served[gv] = nil
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("API server %s: discovery of %s: %w", rc.Host, gv, err)
		}
		m := map[string]string{}
		for _, r := range list.APIResources {
			if !strings.Contains(r.Name, "/") { // "/": a subresource
				m[r.Name] = r.Kind
			}
		}
		served[gv] = m
		return m, nil
	}
	objs := &cluster.Objects{}
	var decodeErrs []error
	var missing []cluster.Kind
	list := func(gv schema.GroupVersion, resource, kind string) error {
		p := path.Join("/apis", gv.Group, gv.Version, resource)
		if gv.Group == "" {
			p = path.Join("/api", gv.Version, resource)
		}
		b, err := disc.RESTClient().Get().AbsPath(p).DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("API server %s: list %s: %w", rc.Host, p, err)
		}
		doc, err := listDocument(b, gv.String(), kind)
		if err != nil {
			return fmt.Errorf("API server %s: list %s: %w", rc.Host, p, err)
		}
		decodeErrs = append(decodeErrs, cluster.Decode(p, doc, objs)...)
		return nil
	}
	for _, k := range cluster.Kinds() {
		m, err := resources(k.GroupVersion)
		if err != nil {
			return nil, nil, nil, err
		}
		if m[k.Resource] != k.Name {
			missing = append(missing, k)
			continue
		}
		if err := list(k.GroupVersion, k.Resource, k.Name); err != nil {
			return nil, nil, nil, err
		}
	}
	// The ignored kinds: at the group's preferred version that serves them.
	groups, err := disc.ServerGroups()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("API server %s: discovery of API groups: %w", rc.Host, err)
	}
	for _, gk := range cluster.IgnoredKinds() {
		for _, g := range groups.Groups {
			if g.Name != gk.Group {
				continue
			}
			versions := []string{g.PreferredVersion.Version}
			for _, v := range g.Versions {
				if !slices.Contains(versions, v.Version) {
					versions = append(versions, v.Version)
				}
			}
			for _, v := range versions {
				gv := schema.GroupVersion{Group: g.Name, Version: v}
				m, err := resources(gv)
				if err != nil {
					return nil, nil, nil, err
				}
				res := ""
				for r, kind := range m {
					if kind == gk.Kind {
						res = r
					}
				}
				if res == "" {
					continue
				}
				if err := list(gv, res, gk.Kind); err != nil {
					return nil, nil, nil, err
				}
				break
			}
		}
	}
	objs.Sort()
	return objs, decodeErrs, missing, nil
}

// listDocument turns an API server list answer into a List document whose
// items carry their apiVersion and kind (the server leaves them out of list
// items), without managedFields, for cluster.Decode.
func listDocument(b []byte, apiVersion, kind string) ([]byte, error) {
	var l struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, err
	}
	for _, it := range l.Items {
		it["apiVersion"], it["kind"] = apiVersion, kind
		if md, ok := it["metadata"].(map[string]any); ok {
			delete(md, "managedFields")
		}
	}
	if l.Items == nil {
		l.Items = []map[string]any{}
	}
	return json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": l.Items})
}
