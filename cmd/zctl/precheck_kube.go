package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// The root ConfigMap ztunnel-cp publishes (bootstrap.RootConfigMapName and
// RootConfigMapKey; a test compares them) and the CA Secret's keys.
const (
	rootConfigMap = "istio-ca-root-cert"
	rootCertKey   = "root-cert.pem"
	rootKeyKey    = "root-key.pem"
)

// clusterChecks asks the API server kubeconfig points at for the kinds the
// control plane watches (cluster.Kinds: a missing CRD never syncs, so
// ztunnel-cp never becomes ready), the CA Secret and the root ConfigMap.
func clusterChecks(kubeconfig, namespace, secret string) (string, []checkResult, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	rc.Timeout = 10 * time.Second
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return "", nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := kc.Discovery().ServerVersion(); err != nil {
		return "", nil, fmt.Errorf("API server %s: %w", rc.Host, err)
	}
	from := rc.Host + " (kubeconfig " + kubeconfig + ")"

	var out []checkResult
	byGV := map[string][]string{}
	var gvs []string
	for _, k := range cluster.Kinds() {
		gv := k.GroupVersion.String()
		if _, ok := byGV[gv]; !ok {
			gvs = append(gvs, gv)
		}
		byGV[gv] = append(byGV[gv], k.Resource)
	}
	for _, gv := range gvs {
		c := checkResult{Check: "API " + gv}
		served := map[string]bool{}
		list, err := kc.Discovery().ServerResourcesForGroupVersion(gv)
		if err == nil {
			for _, r := range list.APIResources {
				served[r.Name] = true
			}
		} else if !apierrors.IsNotFound(err) {
			return "", nil, fmt.Errorf("API server %s: discovery of %s: %w", rc.Host, gv, err)
		}
		var missing []string
		for _, r := range byGV[gv] {
			if !served[r] {
				missing = append(missing, r)
			}
		}
		switch {
		case len(missing) == 0:
			c.Status, c.Detail = checkOK, "serves "+strings.Join(byGV[gv], ", ")
		default:
			c.Status, c.Detail = checkFail, "missing "+strings.Join(missing, ", ")+" (ztunnel-cp watches them and never becomes ready without them)"
			c.Fix = crdFix(gv)
		}
		out = append(out, c)
	}

	sc := checkResult{Check: "CA Secret " + namespace + "/" + secret}
	var rootPEM []byte
	s, err := kc.CoreV1().Secrets(namespace).Get(ctx, secret, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		sc.Status, sc.Detail = checkFail, "not found"
		sc.Fix = fmt.Sprintf("create it before installing: kubectl -n %s create secret generic %s --from-file=%s --from-file=%s",
			namespace, secret, rootCertKey, rootKeyKey)
	case err != nil:
		sc.Status, sc.Detail, sc.Fix = checkWarn, "cannot read it: "+err.Error(), "run precheck with credentials that may get Secrets in "+namespace
	default:
		var absent []string
		for _, k := range []string{rootCertKey, rootKeyKey} {
			if len(s.Data[k]) == 0 {
				absent = append(absent, k)
			}
		}
		if len(absent) > 0 {
			sc.Status, sc.Detail = checkFail, "has no "+strings.Join(absent, " or ")
			sc.Fix = "recreate it with both keys (PEM root certificate and its private key)"
		} else {
			sc.Status, sc.Detail, rootPEM = checkOK, "holds "+rootCertKey+" and "+rootKeyKey, s.Data[rootCertKey]
		}
	}
	out = append(out, sc)

	cc := checkResult{Check: "root ConfigMap " + namespace + "/" + rootConfigMap}
	cm, err := kc.CoreV1().ConfigMaps(namespace).Get(ctx, rootConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cc.Status, cc.Detail = checkWarn, "not published yet"
		cc.Fix = "ztunnel-cp publishes it once running; if it runs, see its logs (node proxies mount it)"
	case err != nil:
		cc.Status, cc.Detail, cc.Fix = checkWarn, "cannot read it: "+err.Error(), "run precheck with credentials that may get ConfigMaps in "+namespace
	case cm.Data[rootCertKey] == "":
		cc.Status, cc.Detail, cc.Fix = checkFail, "has no "+rootCertKey, "delete it; ztunnel-cp republishes it"
	case rootPEM != nil && !bytes.Equal(bytes.TrimSpace(rootPEM), bytes.TrimSpace([]byte(cm.Data[rootCertKey]))):
		cc.Status, cc.Detail = checkFail, "differs from the CA Secret's "+rootCertKey+": node proxies would not trust the CA's certificates"
		cc.Fix = "delete the ConfigMap; ztunnel-cp republishes it from the Secret"
	default:
		cc.Status, cc.Detail = checkOK, "published"
		if rootPEM != nil {
			cc.Detail += ", the same root as the CA Secret"
		}
	}
	return from, append(out, cc), nil
}

func crdFix(gv string) string {
	switch {
	case strings.HasPrefix(gv, "gateway.networking.k8s.io/"):
		return "install Gateway API's standard CRDs (standard-install.yaml of the release ztunnel-go is built with)"
	case slices.ContainsFunc([]string{"networking.istio.io/", "security.istio.io/"}, func(p string) bool { return strings.HasPrefix(gv, p) }):
		return "install Istio's CRDs (the chart's crds/ directory: helm installs them, or kubectl apply -f it)"
	}
	return "the API server does not serve " + gv + ": a Kubernetes version that does is needed"
}
