package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// minKubeMinor is the oldest Kubernetes minor version precheck accepts
// without a warning.
const minKubeMinor = 30

// The chart's DaemonSets (deploy/chart/ztunnel-go/templates).
const (
	agentDaemonSet = "ztunnel-cni"
	proxyDaemonSet = "ztunnel"
)

// clusterChecks asks the API server kubeconfig points at for its version,
// the kinds the control plane watches (cluster.Kinds: a missing CRD never
// syncs, so ztunnel-cp never becomes ready) and the CA Secret; after the
// install (after) also the root ConfigMap and the node agent and node proxy
// DaemonSets. Before the install a missing CRD that the chart itself ships
// (Istio's) is no failure: helm install adds it.
func clusterChecks(kubeconfig, namespace, secret string, after bool) (string, []checkResult, error) {
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
	ver, err := kc.Discovery().ServerVersion()
	if err != nil {
		return "", nil, fmt.Errorf("API server %s: %w", rc.Host, err)
	}
	from := rc.Host + " (kubeconfig " + kubeconfig + ")"

	var out []checkResult
	if !after {
		out = append(out, versionCheck(ver.Major, ver.Minor, ver.GitVersion))
	}
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
		case !after && chartShipsCRDs(gv):
			c.Status, c.Detail = checkOK, "missing "+strings.Join(missing, ", ")+" for now: helm install adds them (the chart's crds/)"
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
	if !after {
		return from, out, nil
	}

	cc := checkResult{Check: "root ConfigMap " + namespace + "/" + rootConfigMap}
	cm, err := kc.CoreV1().ConfigMaps(namespace).Get(ctx, rootConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cc.Status, cc.Detail = checkFail, "not published"
		cc.Fix = "ztunnel-cp publishes it once running (node proxies mount it): see kubectl -n " + namespace + " get pods,events and ztunnel-cp's log; under istiod, istiod publishes it"
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
	out = append(out, cc)
	for _, ds := range []struct{ name, what, fix string }{
		{agentDaemonSet, "node agent", "it is Ready once its CNI plugin is installed and chained where the container runtime reads its CNI config: " +
			"its log names the directories it read (zctl precheck on that node shows the runtime's); chart values cni.cniBinDir/cni.cniConfDir override them"},
		{proxyDaemonSet, "node proxy", "it is Ready once it has its certificate and the control plane's first push: see its log"},
	} {
		out = append(out, daemonSetCheck(ctx, kc, namespace, ds.name, ds.what, ds.fix))
	}
	return from, out, nil
}

// chartShipsCRDs: the chart's crds/ holds the group's CRDs (Istio's), so
// helm install adds them; Gateway API's the user installs first.
func chartShipsCRDs(gv string) bool {
	return strings.HasPrefix(gv, "networking.istio.io/") || strings.HasPrefix(gv, "security.istio.io/")
}

func versionCheck(major, minor, git string) checkResult {
	c := checkResult{Check: "Kubernetes version"}
	maj, _ := strconv.Atoi(strings.TrimRight(major, "+"))
	mnr, _ := strconv.Atoi(strings.TrimRight(minor, "+"))
	if maj == 1 && mnr < minKubeMinor {
		c.Status, c.Detail = checkWarn, fmt.Sprintf("%s is older than 1.%d", git, minKubeMinor)
		c.Fix = fmt.Sprintf("ztunnel-go is tested on Kubernetes 1.37; upgrade to 1.%d or later", minKubeMinor)
		return c
	}
	c.Status, c.Detail = checkOK, git
	return c
}

// daemonSetCheck: every scheduled pod of the DaemonSet is Ready; the ones
// that are not are named with their node.
func daemonSetCheck(ctx context.Context, kc kubernetes.Interface, namespace, name, what, fix string) checkResult {
	c := checkResult{Check: what + " " + namespace + "/" + name}
	ds, err := kc.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.Status, c.Detail, c.Fix = checkFail, "not found", "helm install the chart into "+namespace+" (or pass --namespace)"
		return c
	case err != nil:
		c.Status, c.Detail, c.Fix = checkWarn, "cannot read it: "+err.Error(), "run precheck with credentials that may get DaemonSets in "+namespace
		return c
	}
	st := ds.Status
	if st.DesiredNumberScheduled > 0 && st.NumberReady == st.DesiredNumberScheduled {
		c.Status, c.Detail = checkOK, fmt.Sprintf("%d/%d Ready", st.NumberReady, st.DesiredNumberScheduled)
		return c
	}
	c.Status, c.Detail, c.Fix = checkFail, fmt.Sprintf("%d/%d Ready", st.NumberReady, st.DesiredNumberScheduled), fix
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return c
	}
	pods, err := kc.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return c
	}
	var notReady []string
	for _, p := range pods.Items {
		ready := false
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if !ready {
			notReady = append(notReady, p.Name+" on "+p.Spec.NodeName)
		}
	}
	if len(notReady) > 0 {
		c.Detail += "; not Ready: " + strings.Join(notReady, ", ")
	}
	return c
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
