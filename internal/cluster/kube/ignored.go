package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// ignoredRediscover is how often the API server's discovery is asked again
// for ignored kinds that were not served before (a CRD installed later).
var ignoredRediscover = time.Minute

// ignoredWatch is one metadata-only informer of a kind the control plane
// does not read (cluster.IgnoredKinds). These never gate Synced: a cluster
// without Istio's networking CRDs simply has none of them, and an object of
// such a kind only needs to be reported, never translated.
type ignoredWatch struct {
	gvk      schema.GroupVersionKind
	informer cache.SharedIndexInformer
}

// ignoredSet holds the ignored-kind informers started so far (appended by
// watchIgnored, read by publish).
type ignoredSet struct {
	mu      sync.Mutex
	watches []ignoredWatch
}

// servedKind is an ignored kind the API server serves: its resource and its
// kind at that version.
type servedKind struct {
	gvr schema.GroupVersionResource
	gvk schema.GroupVersionKind
}

// discoverIgnored finds which ignored kinds the API server serves, and at
// which version (the group's preferred one when it serves the kind).
func (s *Source) discoverIgnored() ([]servedKind, error) {
	want := map[string][]string{} // group → kinds
	for _, gk := range cluster.IgnoredKinds() {
		want[gk.Group] = append(want[gk.Group], gk.Kind)
	}
	disc := s.cfg.Clients.Kube.Discovery()
	groups, err := disc.ServerGroups()
	if err != nil {
		return nil, fmt.Errorf("kube: discovery of API groups: %w", err)
	}
	var served []servedKind
	for _, g := range groups.Groups {
		kinds := want[g.Name]
		if len(kinds) == 0 {
			continue
		}
		// The preferred version first, then the others: a kind may be
		// served only at an older version of its group (ReferenceGrant
		// in v1beta1 while the group prefers v1).
		versions := []metav1.GroupVersionForDiscovery{g.PreferredVersion}
		for _, v := range g.Versions {
			if v.GroupVersion != g.PreferredVersion.GroupVersion {
				versions = append(versions, v)
			}
		}
		found := map[string]bool{}
		for _, v := range versions {
			if v.GroupVersion == "" {
				continue
			}
			res, err := disc.ServerResourcesForGroupVersion(v.GroupVersion)
			if apierrors.IsNotFound(err) {
				continue // removed between the two calls
			}
			if err != nil {
				return nil, fmt.Errorf("kube: discovery of %s: %w", v.GroupVersion, err)
			}
			for _, r := range res.APIResources {
				if !slices.Contains(kinds, r.Kind) || found[r.Kind] || r.Name == "" || strings.Contains(r.Name, "/") { // "/": a subresource
					continue
				}
				found[r.Kind] = true
				served = append(served, servedKind{
					gvr: schema.GroupVersionResource{Group: g.Name, Version: v.Version, Resource: r.Name},
					gvk: schema.GroupVersionKind{Group: g.Name, Version: v.Version, Kind: r.Kind},
				})
			}
		}
	}
	return served, nil
}

// watchIgnored starts a metadata informer for every ignored kind the API
// server serves, asks again every ignoredRediscover for the ones it did
// not, and returns when ctx is done. Objects of these kinds enter every
// published set as cluster.IgnoredObject.
func (s *Source) watchIgnored(ctx context.Context) {
	if s.cfg.Clients.Metadata == nil {
		return
	}
	factory := metadatainformer.NewSharedInformerFactoryWithOptions(s.cfg.Clients.Metadata, 0,
		metadatainformer.WithTransform(stripManagedFields))
	defer factory.Shutdown()
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.bump() },
		UpdateFunc: func(any, any) {}, // only identity is reported; it does not change
		DeleteFunc: func(any) { s.bump() },
	}
	tick := time.NewTicker(ignoredRediscover)
	defer tick.Stop()
	logged := false
	watching := map[schema.GroupKind]bool{} // this goroutine's own record
	for {
		served, err := s.discoverIgnored()
		if err != nil && !logged {
			// Reported once; the ticker retries. Until then ignored objects
			// are not listed (nothing is translated from them either way).
			s.log.Warn("cannot discover the kinds the control plane ignores; objects of them are not reported until it can", zap.Error(err))
			logged = true
		}
		started := 0
		for _, k := range served {
			gk := k.gvk.GroupKind()
			if watching[gk] {
				continue
			}
			inf := factory.ForResource(k.gvr).Informer()
			if _, err := inf.AddEventHandler(handler); err != nil {
				s.log.Warn("ignored kind not watched", zap.String("kind", gk.String()), zap.Error(err))
				continue
			}
			watching[gk] = true
			s.ignored.mu.Lock()
			s.ignored.watches = append(s.ignored.watches, ignoredWatch{gvk: k.gvk, informer: inf})
			s.ignored.mu.Unlock()
			started++
		}
		if started > 0 {
			factory.Start(ctx.Done())
			s.log.Info("watching kinds the control plane does not read, to report them", zap.Int("kinds", started))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// addIgnored adds the ignored objects the informers hold to objs.
func (s *Source) addIgnored(objs *cluster.Objects) {
	s.ignored.mu.Lock()
	watches := slices.Clone(s.ignored.watches)
	s.ignored.mu.Unlock()
	for _, w := range watches {
		for _, o := range w.informer.GetStore().List() {
			m, ok := o.(*metav1.PartialObjectMetadata)
			if !ok {
				continue
			}
			objs.Add(&cluster.IgnoredObject{
				APIVersion: w.gvk.GroupVersion().String(), Kind: w.gvk.Kind,
				Namespace: m.GetNamespace(), Name: m.GetName(),
			})
		}
	}
}
