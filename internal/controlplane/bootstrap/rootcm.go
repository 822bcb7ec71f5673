package bootstrap

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The ConfigMap node proxies mount for XDS_ROOT_CA/CA_ROOT_CA, as istiod
// publishes it.
const (
	RootConfigMapName = "istio-ca-root-cert"
	RootConfigMapKey  = "root-cert.pem"
	// rootRecheck spaces checks once published (someone may delete or edit it).
	rootRecheck = time.Minute
	// rootMaxBackoff caps the retry interval after a failed write.
	rootMaxBackoff = 30 * time.Second
)

// RootPublisher keeps ConfigMap RootConfigMapName in Namespace holding
// RootPEM under RootConfigMapKey (Kubernetes mode). Every replica runs one;
// they write the same content (the root comes from the shared Secret), and
// a replica writes only when the content differs, so they do not fight.
type RootPublisher struct {
	// Client gets, creates and updates the ConfigMap. Required.
	Client kubernetes.Interface
	// Namespace of the ConfigMap (the control plane's own). Required.
	Namespace string
	// RootPEM is the content. Required.
	RootPEM []byte
	// Log: nil means no logging.
	Log *zap.Logger

	published atomic.Bool
}

// Published reports whether the ConfigMap has held RootPEM at least once.
func (p *RootPublisher) Published() bool { return p.published.Load() }

// Run publishes until ctx is done: retrying with backoff until the first
// success, then re-checking every rootRecheck.
func (p *RootPublisher) Run(ctx context.Context) {
	log := p.Log
	if log == nil {
		log = zap.NewNop()
	}
	backoff := time.Second
	var lastErr string
	for {
		wait := rootRecheck
		changed, err := p.publish(ctx)
		switch {
		case err != nil:
			if err.Error() != lastErr {
				log.Warn("publishing the root certificate ConfigMap failed; retrying", zap.Error(err))
			}
			lastErr = err.Error()
			wait, backoff = backoff, min(2*backoff, rootMaxBackoff)
		default:
			lastErr, backoff = "", time.Second
			if changed || !p.published.Load() {
				log.Info("root certificate ConfigMap published", zap.String("configmap", p.Namespace+"/"+RootConfigMapName), zap.Bool("written", changed))
			}
			p.published.Store(true)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// publish makes the ConfigMap hold RootPEM (get, then create or update
// only if needed) and reports whether it wrote. A conflict with another
// writer is an error; the next round re-reads.
func (p *RootPublisher) publish(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cms := p.Client.CoreV1().ConfigMaps(p.Namespace)
	want := string(p.RootPEM)
	cur, err := cms.Get(ctx, RootConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RootConfigMapName, Namespace: p.Namespace},
			Data:       map[string]string{RootConfigMapKey: want},
		}, metav1.CreateOptions{FieldManager: ServiceName})
		if err != nil {
			return false, fmt.Errorf("create configmap %s/%s: %w", p.Namespace, RootConfigMapName, err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get configmap %s/%s: %w", p.Namespace, RootConfigMapName, err)
	case cur.Data[RootConfigMapKey] == want:
		return false, nil
	}
	cur = cur.DeepCopy()
	if cur.Data == nil {
		cur.Data = map[string]string{}
	}
	cur.Data[RootConfigMapKey] = want
	if _, err := cms.Update(ctx, cur, metav1.UpdateOptions{FieldManager: ServiceName}); err != nil {
		return false, fmt.Errorf("update configmap %s/%s: %w", p.Namespace, RootConfigMapName, err)
	}
	return true, nil
}
