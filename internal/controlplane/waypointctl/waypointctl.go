// Package waypointctl is the Kubernetes-mode waypoint controller, what
// istiod's does for Gateways of class istio-waypoint (and, the same way,
// of class istio-east-west: the binary in east-west mode on the Gateway's
// topology.istio.io/network, its Service a LoadBalancer whose ingress
// addresses go to status.addresses): for each such Gateway
// it applies (server-side, owned by the Gateway so they go with it) a
// ServiceAccount, a Service (HBONE 15008, status 15021) and a Deployment of
// ztunnel-go's waypoint, copies the mesh root into the namespace's
// istio-ca-root-cert ConfigMap the waypoint verifies the control plane
// with, and writes the Gateway's status: the Service's cluster IP in
// status.addresses (which the translation reads as the waypoint's address)
// and the Accepted and Programmed conditions (Programmed once a replica is
// available). The Deployment is built in, or rendered from a template
// file (Template: the chart's ConfigMap ztunnel-go-waypoint-template, as
// istiod's gateway deployment template) with ownership, selection and
// identity enforced; a template that does not render leaves the Gateway
// Programmed=False rather than skipped.
//
// Only the replica holding the control plane's lease reconciles (Leading).
// A Gateway annotated gateway.istio.io/managed: "false" (or one that names
// its own address in spec.addresses) is left to its owner, as istiod does.
// It does not translate anything (internal/controlplane/translate) and
// reads the cluster through a cluster.Source.
package waypointctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gatewayac "sigs.k8s.io/gateway-api/applyconfiguration/apis/v1"
	gatewayclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// Names and defaults.
const (
	// WaypointClass is the GatewayClass of waypoints (the translation's).
	WaypointClass = translate.WaypointClass
	// EastWestClass is the GatewayClass of east-west gateways (Istio
	// ambient multi-network): the same binary in east-west mode
	// (proxy/eastwest), on the network its Gateway's NetworkLabel names.
	EastWestClass = translate.EastWestClass
	// NetworkLabel on an east-west Gateway is its network; it is passed to
	// the gateway (env NETWORK) and set on its pods, as istiod does.
	NetworkLabel = translate.LabelNetwork
	// FieldManager names the controller in managedFields.
	FieldManager = "ztunnel-go-waypoint"
	// ManagedAnnotation "false" leaves a Gateway's deployment to its owner.
	ManagedAnnotation = "gateway.istio.io/managed"
	// GatewayNameLabel marks the objects of one waypoint (Gateway API's
	// label, which istiod also sets).
	GatewayNameLabel = "gateway.networking.k8s.io/gateway-name"
	// RootConfigMap is the root certificate ConfigMap in each waypoint's
	// namespace (key root-cert.pem), as istiod publishes it.
	RootConfigMap = "istio-ca-root-cert"
	// CRLConfigMap holds the CRLs in each waypoint's namespace (key
	// CRLKey), as istiod publishes istio-ca-crl beside the root; the
	// waypoint mounts it at CRLDir and reads CRL_PATH=CRLDir/CRLKey.
	CRLConfigMap = "istio-ca-crl"
	CRLKey       = "ca-crl.pem"
	CRLDir       = "/var/run/secrets/istio-crl"
	// DefaultResync is how often everything is re-applied even without a
	// change (a deleted Service comes back).
	DefaultResync = time.Minute
)

// Config configures New.
type Config struct {
	Kube    kubernetes.Interface
	Gateway gatewayclient.Interface
	Source  cluster.Source
	// Leading reports whether this replica may write (nil: always).
	Leading func() bool
	// Image of the waypoint container (registry/waypoint:tag). Required.
	Image string
	// PullPolicy of the image ("": IfNotPresent).
	PullPolicy corev1.PullPolicy
	// XDSAddress and CAAddress the waypoint connects to (host:port).
	XDSAddress, CAAddress string
	// TrustDomain of the waypoint's identity.
	TrustDomain string
	// RootPEM returns the mesh root the waypoint verifies the control
	// plane with (nil: not yet known; the ConfigMap waits).
	RootPEM func() []byte
	// CRLPEM, if set, returns the CRLs the node proxies enforce (the
	// chart's ztunnel.peerCaCrl, mounted into ztunnel-cp), read on every
	// reconcile: each waypoint namespace gets them as ConfigMap
	// CRLConfigMap and each waypoint enforces them (CRL_PATH). An error
	// leaves every Gateway Programmed=False and its Deployment as it was:
	// no waypoint is deployed without the CRLs it must enforce. nil: none.
	CRLPEM func() ([]byte, error)
	// TemplateFile, if set, is the waypoint Deployment as a Go
	// text/template (Template), read again on every reconcile so an
	// edited ConfigMap takes effect; ValuesFile holds its .Values (YAML).
	// A template that fails to load or render leaves the Gateway with
	// Programmed=False (reason Invalid) and its Deployment unapplied.
	// "": the built-in Deployment.
	TemplateFile, ValuesFile string
	// Resync: 0 means DefaultResync.
	Resync time.Duration
	Log    *zap.Logger
}

// Controller reconciles waypoint Gateways. Create it with New, then Run.
type Controller struct {
	cfg Config
	log *zap.Logger
}

// New validates cfg.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.Kube == nil || cfg.Gateway == nil:
		return nil, errors.New("waypointctl: Config.Kube and Config.Gateway are required")
	case cfg.Source == nil:
		return nil, errors.New("waypointctl: Config.Source is required")
	case cfg.Image == "":
		return nil, errors.New("waypointctl: Config.Image is required")
	case cfg.XDSAddress == "":
		return nil, errors.New("waypointctl: Config.XDSAddress is required")
	}
	if cfg.CAAddress == "" {
		cfg.CAAddress = cfg.XDSAddress
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "cluster.local"
	}
	if cfg.PullPolicy == "" {
		cfg.PullPolicy = corev1.PullIfNotPresent
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Leading == nil {
		cfg.Leading = func() bool { return true }
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Controller{cfg: cfg, log: log}, nil
}

// Run reconciles after every change of the source and every Resync, until
// ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	for {
		objs, changed := c.cfg.Source.Current()
		if objs != nil && c.cfg.Leading() {
			c.Reconcile(ctx, objs)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// Managed reports whether the controller deploys gw: a waypoint or an
// east-west gateway, not annotated as deployed by its owner.
func Managed(gw *gatewayv1.Gateway) bool {
	c := string(gw.Spec.GatewayClassName)
	return (c == WaypointClass || c == EastWestClass) && gw.Annotations[ManagedAnnotation] != "false" && len(gw.Spec.Addresses) == 0
}

// eastWest reports whether gw is an east-west gateway.
func eastWest(gw *gatewayv1.Gateway) bool { return string(gw.Spec.GatewayClassName) == EastWestClass }

// Modes of the waypoint binary (its --mode, env GATEWAY_MODE).
const (
	ModeWaypoint = "waypoint"
	ModeEastWest = "east-west"
)

// mode is the binary's mode for gw.
func mode(gw *gatewayv1.Gateway) string {
	if eastWest(gw) {
		return ModeEastWest
	}
	return ModeWaypoint
}

// Reconcile applies every managed waypoint of objs once and returns how
// many failed (each failure is logged with the Gateway it concerns).
func (c *Controller) Reconcile(ctx context.Context, objs *cluster.Objects) (failed int) {
	var tmpl *Template
	var tmplErr error
	if c.cfg.TemplateFile != "" {
		tmpl, tmplErr = LoadTemplate(c.cfg.TemplateFile, c.cfg.ValuesFile)
	}
	var crlPEM []byte
	if c.cfg.CRLPEM != nil {
		var err error
		if crlPEM, err = c.cfg.CRLPEM(); err == nil && len(crlPEM) == 0 {
			err = errors.New("empty")
		}
		if err != nil {
			tmplErr = errors.Join(tmplErr, fmt.Errorf("waypoint CRLs (the node proxies' peerCaCrl): %w", err))
		}
	}
	roots := map[string]bool{}
	for _, gw := range objs.Gateways {
		if !Managed(gw) {
			continue
		}
		if !roots[gw.Namespace] {
			if err := c.applyRoot(ctx, gw.Namespace); err != nil {
				c.log.Warn("waypoint root ConfigMap not written", zap.String("namespace", gw.Namespace), zap.Error(err))
			}
			roots[gw.Namespace] = true
		}
		gwErr := tmplErr
		if len(crlPEM) > 0 {
			if err := c.applyCRL(ctx, gw.Namespace, crlPEM); err != nil {
				gwErr = errors.Join(gwErr, fmt.Errorf("CRL ConfigMap %s/%s: %w", gw.Namespace, CRLConfigMap, err))
			}
		}
		if err := c.apply(ctx, gw, tmpl, gwErr); err != nil {
			failed++
			c.log.Warn("waypoint not reconciled", zap.String("gateway", gw.Namespace+"/"+gw.Name), zap.Error(err))
		}
	}
	return failed
}

func (c *Controller) applyRoot(ctx context.Context, ns string) error {
	if c.cfg.RootPEM == nil {
		return nil
	}
	pem := c.cfg.RootPEM()
	if len(pem) == 0 {
		return errors.New("mesh root not known yet")
	}
	cm := corev1ac.ConfigMap(RootConfigMap, ns).WithData(map[string]string{"root-cert.pem": string(pem)})
	_, err := c.cfg.Kube.CoreV1().ConfigMaps(ns).Apply(ctx, cm, apply())
	return err
}

// applyCRL writes the CRLs into namespace ns for its waypoints to mount.
func (c *Controller) applyCRL(ctx context.Context, ns string, pem []byte) error {
	cm := corev1ac.ConfigMap(CRLConfigMap, ns).WithData(map[string]string{CRLKey: string(pem)})
	_, err := c.cfg.Kube.CoreV1().ConfigMaps(ns).Apply(ctx, cm, apply())
	return err
}

func apply() metav1.ApplyOptions { return metav1.ApplyOptions{FieldManager: FieldManager, Force: true} }

// waypointLabels are the labels of one waypoint's objects and pods, as
// istiod's waypoint deployment sets them: gateway.istio.io/managed marks
// them as the mesh controller's, so istiod and istioctl analyze treat them
// as a waypoint (never bound to a waypoint; no port-naming or UID
// findings) and our translation does too.
//
// An east-west gateway's objects also carry its network label, so its
// pods are on its network in the workload API.
func waypointLabels(gw *gatewayv1.Gateway) map[string]string {
	l := map[string]string{GatewayNameLabel: gw.Name, "istio.io/gateway-name": gw.Name, ManagedLabel: ManagedMeshController}
	if n := gw.Labels[NetworkLabel]; eastWest(gw) && n != "" {
		l[NetworkLabel] = n
	}
	return l
}

// ManagedLabel and ManagedMeshController: istio/api's
// gateway.istio.io/managed label and its value for waypoints.
const (
	ManagedLabel          = translate.LabelGatewayManaged
	ManagedMeshController = translate.ManagedMeshController
)

// ProxyContainer is the waypoint container's name: Istio's tools (istioctl
// analyze, proxy-status) recognise the proxy container by it.
const ProxyContainer = "istio-proxy"

// apply is one waypoint: its objects, then its status. With a template
// (tmpl, or tmplErr if it failed to load) the Deployment is rendered from
// it; a failure is written to the Gateway's status and returned.
func (c *Controller) apply(ctx context.Context, gw *gatewayv1.Gateway, tmpl *Template, tmplErr error) error {
	owner := metav1ac.OwnerReference().WithAPIVersion(gatewayv1.GroupVersion.String()).WithKind("Gateway").
		WithName(gw.Name).WithUID(gw.UID).WithController(true).WithBlockOwnerDeletion(true)
	labels := waypointLabels(gw)

	sa := corev1ac.ServiceAccount(gw.Name, gw.Namespace).WithLabels(labels).WithOwnerReferences(owner)
	if _, err := c.cfg.Kube.CoreV1().ServiceAccounts(gw.Namespace).Apply(ctx, sa, apply()); err != nil {
		return fmt.Errorf("service account: %w", err)
	}
	spec := corev1ac.ServiceSpec().WithSelector(map[string]string{GatewayNameLabel: gw.Name}).WithPorts(
		corev1ac.ServicePort().WithName("mesh").WithPort(15008).WithAppProtocol("all").WithTargetPort(intstr.FromInt32(15008)),
		corev1ac.ServicePort().WithName("status-port").WithPort(15021).WithTargetPort(intstr.FromInt32(15021)),
	)
	if eastWest(gw) {
		// Other networks reach it from outside the cluster, as istiod's
		// east-west Service (LoadBalancer, 15008 and 15021).
		spec.WithType(corev1.ServiceTypeLoadBalancer)
	}
	svc := corev1ac.Service(gw.Name, gw.Namespace).WithLabels(labels).WithOwnerReferences(owner).WithSpec(spec)
	applied, err := c.cfg.Kube.CoreV1().Services(gw.Namespace).Apply(ctx, svc, apply())
	if err != nil {
		return fmt.Errorf("service: %w", err)
	}
	dep, err := c.deployment(gw, labels, owner, tmpl, tmplErr)
	if err != nil {
		// Fail closed: the Service (and address) stay, so traffic bound
		// to this waypoint goes nowhere rather than around it.
		err = fmt.Errorf("gateway %s/%s: %w", gw.Namespace, gw.Name, err)
		if serr := c.writeStatus(ctx, gw, applied, nil, err); serr != nil {
			return errors.Join(err, serr)
		}
		return err
	}
	d, err := c.cfg.Kube.AppsV1().Deployments(gw.Namespace).Apply(ctx, dep, apply())
	if err != nil {
		return fmt.Errorf("deployment: %w", err)
	}
	return c.writeStatus(ctx, gw, applied, d, nil)
}

// deployment is the waypoint's Deployment: rendered from the template if
// there is one, else built in.
func (c *Controller) deployment(gw *gatewayv1.Gateway, labels map[string]string, owner *metav1ac.OwnerReferenceApplyConfiguration, tmpl *Template, tmplErr error) (*appsv1ac.DeploymentApplyConfiguration, error) {
	switch {
	case tmplErr != nil:
		return nil, tmplErr
	case eastWest(gw) && gw.Labels[NetworkLabel] == "":
		// istiod makes no network gateway of such a Gateway either; a
		// gateway on a guessed network would forward where nobody meant.
		return nil, fmt.Errorf("an %s Gateway needs the label %s naming its network", EastWestClass, NetworkLabel)
	case tmpl != nil:
		return tmpl.Render(c.input(gw))
	}
	// The built-in Deployment sets the mode's env like a template's
	// rendering gets it (Render).
	return c.builtinDeployment(gw, labels, owner), nil
}

func (c *Controller) builtinDeployment(gw *gatewayv1.Gateway, labels map[string]string, owner *metav1ac.OwnerReferenceApplyConfiguration) *appsv1ac.DeploymentApplyConfiguration {
	fieldEnv := func(name, path string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath(path)))
	}
	container := corev1ac.Container().WithName(ProxyContainer).WithImage(c.cfg.Image).WithImagePullPolicy(c.cfg.PullPolicy).
		WithEnv(
			corev1ac.EnvVar().WithName("GATEWAY_NAME").WithValue(gw.Name),
			fieldEnv("POD_NAMESPACE", "metadata.namespace"),
			fieldEnv("POD_NAME", "metadata.name"),
			fieldEnv("NODE_NAME", "spec.nodeName"),
			fieldEnv("INSTANCE_IP", "status.podIP"),
			fieldEnv("SERVICE_ACCOUNT", "spec.serviceAccountName"),
			corev1ac.EnvVar().WithName("XDS_ADDRESS").WithValue(c.cfg.XDSAddress),
			corev1ac.EnvVar().WithName("CA_ADDRESS").WithValue(c.cfg.CAAddress),
			corev1ac.EnvVar().WithName("TRUST_DOMAIN").WithValue(c.cfg.TrustDomain),
		).
		WithEnv(modeEnv(gw)...).
		WithPorts(
			corev1ac.ContainerPort().WithName("mesh").WithContainerPort(15008),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(15020),
			corev1ac.ContainerPort().WithName("status-port").WithContainerPort(15021),
		).
		WithReadinessProbe(corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().WithPath("/healthz/ready").WithPort(intstr.FromInt32(15021))).
			WithPeriodSeconds(2)).
		WithVolumeMounts(
			corev1ac.VolumeMount().WithName("istio-token").WithMountPath("/var/run/secrets/tokens").WithReadOnly(true),
			corev1ac.VolumeMount().WithName("istio-ca-root-cert").WithMountPath("/var/run/secrets/istio").WithReadOnly(true),
		).
		WithSecurityContext(corev1ac.SecurityContext().WithRunAsNonRoot(true).WithRunAsUser(1337).WithRunAsGroup(1337).
			WithAllowPrivilegeEscalation(false).WithReadOnlyRootFilesystem(true).
			WithCapabilities(corev1ac.Capabilities().WithDrop("ALL")))
	if c.cfg.CRLPEM != nil {
		container.WithEnv(corev1ac.EnvVar().WithName("CRL_PATH").WithValue(CRLDir + "/" + CRLKey)).
			WithVolumeMounts(corev1ac.VolumeMount().WithName("istio-ca-crl").WithMountPath(CRLDir).WithReadOnly(true))
	}
	pod := corev1ac.PodTemplateSpec().
		WithLabels(labels).
		// The waypoint's own traffic is not captured (it is the mesh).
		WithLabels(map[string]string{"istio.io/dataplane-mode": "none"}).
		WithSpec(corev1ac.PodSpec().WithServiceAccountName(gw.Name).WithTerminationGracePeriodSeconds(30).
			WithContainers(container).
			WithVolumes(
				corev1ac.Volume().WithName("istio-token").WithProjected(corev1ac.ProjectedVolumeSource().WithSources(
					corev1ac.VolumeProjection().WithServiceAccountToken(corev1ac.ServiceAccountTokenProjection().
						WithAudience("istio-ca").WithExpirationSeconds(43200).WithPath("istio-token")))),
				corev1ac.Volume().WithName("istio-ca-root-cert").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(RootConfigMap)),
			))
	if c.cfg.CRLPEM != nil {
		pod.Spec.WithVolumes(corev1ac.Volume().WithName("istio-ca-crl").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(CRLConfigMap)))
	}
	return appsv1ac.Deployment(gw.Name, gw.Namespace).WithLabels(labels).WithOwnerReferences(owner).
		WithSpec(appsv1ac.DeploymentSpec().WithReplicas(1).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{GatewayNameLabel: gw.Name})).
			WithTemplate(pod))
}

// modeEnv is the env that selects the binary's mode: none for a waypoint
// (its default); GATEWAY_MODE and NETWORK for an east-west gateway.
func modeEnv(gw *gatewayv1.Gateway) []*corev1ac.EnvVarApplyConfiguration {
	if !eastWest(gw) {
		return nil
	}
	return []*corev1ac.EnvVarApplyConfiguration{
		corev1ac.EnvVar().WithName("GATEWAY_MODE").WithValue(ModeEastWest),
		corev1ac.EnvVar().WithName("NETWORK").WithValue(gw.Labels[NetworkLabel]),
	}
}

// statusAddresses are the addresses a Gateway's status names: a
// waypoint's cluster IP (in-cluster clients reach it); an east-west
// gateway's load balancer IPs or hostnames (other networks reach it), or
// its cluster IP if its Service is not a LoadBalancer. missing says what
// is not there yet when there is none.
func statusAddresses(gw *gatewayv1.Gateway, svc *corev1.Service) (addrs []*gatewayac.GatewayStatusAddressApplyConfiguration, missing string) {
	if eastWest(gw) && svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			switch {
			case in.IP != "":
				addrs = append(addrs, gatewayac.GatewayStatusAddress().WithType(gatewayv1.IPAddressType).WithValue(in.IP))
			case in.Hostname != "":
				addrs = append(addrs, gatewayac.GatewayStatusAddress().WithType(gatewayv1.HostnameAddressType).WithValue(in.Hostname))
			}
		}
		return addrs, "the east-west gateway's LoadBalancer Service has no ingress address yet"
	}
	if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		addrs = append(addrs, gatewayac.GatewayStatusAddress().WithType(gatewayv1.IPAddressType).WithValue(ip))
	}
	return addrs, "the waypoint Service has no cluster IP"
}

// writeStatus sets status.addresses (statusAddresses) and the Accepted
// and Programmed conditions; with failed (the Deployment could not be
// made) Programmed is False, reason Invalid, with the error.
func (c *Controller) writeStatus(ctx context.Context, gw *gatewayv1.Gateway, svc *corev1.Service, d *appsv1.Deployment, failed error) error {
	now := metav1.Now()
	cond := func(t gatewayv1.GatewayConditionType, ok bool, reason gatewayv1.GatewayConditionReason, msg string) *metav1ac.ConditionApplyConfiguration {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		// Keep the transition time while the status holds.
		at := now
		for _, old := range gw.Status.Conditions {
			if old.Type == string(t) && old.Status == s {
				at = old.LastTransitionTime
			}
		}
		return metav1ac.Condition().WithType(string(t)).WithStatus(s).WithReason(string(reason)).WithMessage(msg).
			WithObservedGeneration(gw.Generation).WithLastTransitionTime(at)
	}
	st := gatewayac.GatewayStatus().WithConditions(cond(gatewayv1.GatewayConditionAccepted, true, gatewayv1.GatewayReasonAccepted, "deployed by ztunnel-go"))
	addrs, missing := statusAddresses(gw, svc)
	st.WithAddresses(addrs...)
	what := "waypoint"
	if eastWest(gw) {
		what = "east-west gateway"
	}
	switch {
	case failed != nil:
		st.WithConditions(cond(gatewayv1.GatewayConditionProgrammed, false, gatewayv1.GatewayReasonInvalid, failed.Error()))
	case len(addrs) == 0:
		st.WithConditions(cond(gatewayv1.GatewayConditionProgrammed, false, gatewayv1.GatewayReasonAddressNotAssigned, missing))
	case d.Status.AvailableReplicas > 0:
		st.WithConditions(cond(gatewayv1.GatewayConditionProgrammed, true, gatewayv1.GatewayReasonProgrammed, fmt.Sprintf("%d %s replica(s) available", d.Status.AvailableReplicas, what)))
	default:
		st.WithConditions(cond(gatewayv1.GatewayConditionProgrammed, false, gatewayv1.GatewayReasonPending, "no "+what+" replica is available yet"))
	}
	_, err := c.cfg.Gateway.GatewayV1().Gateways(gw.Namespace).ApplyStatus(ctx, gatewayac.Gateway(gw.Name, gw.Namespace).WithStatus(st), apply())
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}
