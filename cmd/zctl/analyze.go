package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	securityv1beta1 "istio.io/api/security/v1beta1"
	corev1 "k8s.io/api/core/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/translate"
)

// errFindings: analyze found at least one error-level finding (exit 2).
var errFindings = errors.New("analyze: error-level findings")

// Finding levels.
const (
	levelError   = "Error"
	levelWarning = "Warning"
	// levelInfo: not applicable here, with the reason (no action needed).
	levelInfo = "Info"
)

// Finding codes are stable: never renumber one, only add new ones.
const (
	codeDecode          = "ZTG0001" // a document that cannot be read
	codeInvalidValue    = "ZTG0002" // a value that cannot be enforced
	codeTargetNothing   = "ZTG0003" // a targetRef that attaches to nothing
	codeSelectsNothing  = "ZTG0004" // a selector policy that selects no workload
	codeNoWaypoint      = "ZTG0005" // a waypoint policy in a mesh with no waypoint
	codeExternalName    = "ZTG0006" // a policy aimed at an ExternalName alias
	codeStrictNonMesh   = "ZTG0007" // STRICT mTLS with clients outside the mesh
	codeSENoAddress     = "ZTG0008" // a ServiceEntry waiting for its allocated address
	codeIgnoredKind     = "ZTG0009" // a kind the control plane does not read
	codeNotSent         = "ZTG0010" // a policy the control plane did not send
	codeTranslationWarn = "ZTG0011" // any other translation warning
	// ZTG0012-0014: analyze_kube.go, analyze_dns.go.
	codeRouteNotApplied = "ZTG0015" // a VirtualService or DestinationRule no waypoint applies
	codeAddressOwned    = "ZTG0016" // a ServiceEntry address owned by someone else (refused)
	codeRouteStatus     = "ZTG0017" // an HTTPRoute/GRPCRoute parent not accepted, or a backendRef refused
	codeGatewayProxy    = "ZTG0018" // config for gateway proxies (ingress/egress Envoy), not the mesh: n/a
)

// finding is one problem analyze reports.
type finding struct {
	Code    string `json:"code"`
	Level   string `json:"level"`
	Object  string `json:"object"` // "Kind namespace/name", or a file
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

// ignoredNotes say what happens instead of an ignored kind.
var ignoredNotes = map[string]string{
	"Sidecar":     "ambient has no sidecars; node proxies receive all config",
	"EnvoyFilter": "node proxies are not Envoy; nothing replaces it",
}

// analyzeDir decodes the YAML under dir with local mode's own reader,
// translates it with the control plane's translation, and reports what will
// not work as written.
func analyzeDir(dir string) ([]finding, error) {
	src, err := loadDir(dir)
	if err != nil {
		return nil, err
	}
	objs, _ := src.Current()
	return analyzeObjects(objs, dir, src.Errors(), nil), nil
}

// loadDir reads dir as local mode does.
func loadDir(dir string) (*local.Source, error) {
	src := local.New(dir, nil, 0)
	if _, err := src.Load(); err != nil {
		return nil, err
	}
	return src, nil
}

// analyzeObjects translates objs (read from source, with decodeErrs for the
// documents that could not be read) and reports what will not work as
// written; pods is the node agents' /pods view, nil when not given.
func analyzeObjects(objs *cluster.Objects, source string, decodeErrs []error, pods []agentPod) []finding {
	var out []finding
	for _, err := range decodeErrs {
		out = append(out, finding{Code: codeDecode, Level: levelError, Object: source, Message: err.Error(),
			Fix: "fix the document (the control plane keeps the last good version of its objects)"})
	}
	if objs == nil {
		objs = &cluster.Objects{}
	}
	cfg := translate.LocalDefaults()
	res := translate.Translate(cfg, objs, nil)
	// The waypoint pass rewrites the status of policies a waypoint enforces.
	_, statuses := translate.WaypointConfigs(cfg, objs, res)
	out = append(out, policyFindings(statuses)...)
	out = append(out, warningFindings(res)...)
	out = append(out, selectorFindings(cfg, objs)...)
	out = append(out, externalNameFindings(objs)...)
	out = append(out, strictFindings(cfg, objs)...)
	out = append(out, serviceEntryFindings(objs)...)
	out = append(out, dnsCaptureFindings(objs, pods)...)
	out = append(out, routeStatusFindings(cfg, objs)...)
	out = append(out, gatewayProxyFindings(objs)...)
	for _, o := range objs.Ignored {
		if o.Kind == "Gateway" && strings.HasPrefix(o.APIVersion, "networking.istio.io/") {
			out = append(out, finding{Code: codeGatewayProxy, Level: levelInfo, Object: o.Kind + " " + o.Namespace + "/" + o.Name,
				Message: "not applicable: an Istio Gateway (" + o.APIVersion + ") configures the gateway proxies its selector picks (an ingress or egress gateway's Envoy), which ztunnel-go does not run or configure; node proxies and waypoints are unaffected, and a gateway's requests into the mesh are handled as any client's",
				Fix:     "none for the mesh; the gateway's own control plane (istiod) reads it"})
			continue
		}
		note := ignoredNotes[o.Kind]
		if note == "" {
			note = "nothing replaces it in the control plane"
		}
		out = append(out, finding{Code: codeIgnoredKind, Level: levelWarning, Object: o.Kind + " " + o.Namespace + "/" + o.Name,
			Message: "ztunnel-go's control plane does not read " + o.Kind + " (" + o.APIVersion + "); it has no effect: " + note,
			Fix:     "delete it, or express it with the kinds listed in the note"})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Code != out[j].Code {
			return out[i].Code < out[j].Code
		}
		return out[i].Object < out[j].Object
	})
	return out
}

// gatewayProxyFindings reports Gateway API Gateways of a class other than
// istio-waypoint, and the routes whose every parent is one: they configure
// gateway proxies (Istio's ingress gateway), not the mesh, and are not
// applicable to ztunnel-go, which neither runs nor configures them.
func gatewayProxyFindings(objs *cluster.Objects) []finding {
	var out []finding
	proxies := map[string]string{} // ns/name → class
	for _, g := range objs.Gateways {
		obj := "Gateway " + g.Namespace + "/" + g.Name
		if c := string(g.Spec.GatewayClassName); c == translate.EastWestClass {
			// Not a proxy ztunnel-go runs, but ztunnel-cp reads it: the
			// network gateway of its network's remote workloads.
			proxies[g.Namespace+"/"+g.Name] = c
			if p := translate.EastWestProblem(g); p != "" {
				out = append(out, finding{Code: codeGatewayProxy, Level: levelWarning, Object: obj,
					Message: "east-west gateway not used: " + p + "; remote workloads of its network get no network gateway, so node proxies of other networks refuse them",
					Fix:     "label it " + translate.LabelNetwork + "=<network> and give it an HBONE listener with tls.mode Terminate (docs/multicluster.md)"})
			} else {
				out = append(out, finding{Code: codeGatewayProxy, Level: levelInfo, Object: obj,
					Message: "east-west gateway of network " + g.Labels[translate.LabelNetwork] + ": ztunnel-cp sends its address (HBONE port 15008) as the network gateway of that network's workloads in other clusters; ztunnel-go does not run it",
					Fix:     "none"})
			}
		} else if c != translate.WaypointClass {
			proxies[g.Namespace+"/"+g.Name] = c
			out = append(out, finding{Code: codeGatewayProxy, Level: levelInfo, Object: obj,
				Message: "not applicable: a Gateway of class " + c + " is a gateway proxy (an ingress gateway), which ztunnel-go does not run or configure; only class " + translate.WaypointClass + " makes a waypoint",
				Fix:     "none for the mesh; that class's controller (istiod for class istio) programs it"})
		}
	}
	route := func(kind, ns, name string, parents []gatewayv1.ParentReference) {
		var names []string
		for _, p := range parents {
			if p.Kind != nil && *p.Kind != "Gateway" || p.Group != nil && *p.Group != gatewayv1.GroupName {
				return // a Service parent: the mesh's
			}
			pns := ns
			if p.Namespace != nil {
				pns = string(*p.Namespace)
			}
			if _, ok := proxies[pns+"/"+string(p.Name)]; !ok {
				return // a waypoint, or a Gateway that does not exist (routeStatusFindings)
			}
			names = append(names, pns+"/"+string(p.Name))
		}
		if len(names) == 0 {
			return
		}
		out = append(out, finding{Code: codeGatewayProxy, Level: levelInfo, Object: kind + " " + ns + "/" + name,
			Message: "not applicable: attached only to gateway proxies (Gateway " + strings.Join(names, ", ") + "), which ztunnel-go does not configure",
			Fix:     "none for the mesh; attach it to a Service (parentRefs kind Service) to route at its waypoint"})
	}
	for _, r := range objs.HTTPRoutes {
		route("HTTPRoute", r.Namespace, r.Name, r.Spec.ParentRefs)
	}
	for _, r := range objs.GRPCRoutes {
		route("GRPCRoute", r.Namespace, r.Name, r.Spec.ParentRefs)
	}
	return out
}

// routeStatusFindings reports what the control plane writes into the
// routes' status.parents (translate.RouteStatuses, the same code) when it
// is not Accepted or not ResolvedRefs.
func routeStatusFindings(cfg translate.Config, objs *cluster.Objects) []finding {
	var out []finding
	for _, st := range translate.RouteStatuses(cfg, objs) {
		obj := st.Kind + " " + st.Namespace + "/" + st.Name
		seen := map[string]bool{}
		for _, p := range st.Parents {
			for _, c := range []translate.RouteCondition{p.Accepted, p.ResolvedRefs} {
				if c.Status || seen[c.Message] {
					continue
				}
				seen[c.Message] = true
				fix := "correct the parentRef, or the rule as the message says"
				if c.Reason == "RefNotPermitted" {
					fix = "the target namespace's owner creates a ReferenceGrant from this route's kind and namespace, or the route uses a backend in its own namespace"
				}
				out = append(out, finding{Code: codeRouteStatus, Level: levelWarning, Object: obj,
					Message: string(c.Reason) + ": " + c.Message, Fix: fix})
			}
		}
	}
	return out
}

// policyFindings reads the translation's per-policy status.
func policyFindings(statuses []translate.PolicyStatus) []finding {
	var out []finding
	for _, st := range statuses {
		obj := st.Kind + " " + st.Name
		if st.Kind == "ServiceEntry" {
			// The control plane's own ownership verdict (translate/ownership.go).
			for _, bad := range st.Invalid {
				out = append(out, finding{Code: codeAddressOwned, Level: levelError, Object: obj,
					Message: bad + "; " + st.Message,
					Fix:     "list only addresses outside the cluster's pods, nodes and other namespaces' Services, not overlapping an older ServiceEntry of another namespace; 0.0.0.0/0 and ::/0 are never accepted"})
			}
			continue
		}
		for _, bad := range st.Invalid {
			out = append(out, finding{Code: codeInvalidValue, Level: levelError, Object: obj,
				Message: bad + "; the control plane: " + or(withoutInvalid(st.Message), "the rule holding it fails closed"),
				Fix:     "correct the value at that field path"})
		}
		switch {
		case strings.Contains(st.Message, "targetRef attaches to nothing"):
			_, rest, _ := strings.Cut(st.Message, "targetRef attaches to nothing: ")
			out = append(out, finding{Code: codeTargetNothing, Level: levelError, Object: obj,
				Message: "targetRef attaches to nothing: " + rest,
				Fix:     "point targetRefs at an existing waypoint Gateway, Service or ServiceEntry in the policy's namespace"})
		case strings.HasPrefix(st.Message, translate.NotEnforcedByWaypoint):
			out = append(out, finding{Code: codeNoWaypoint, Level: levelWarning, Object: obj,
				Message: st.Message,
				Fix:     "deploy a waypoint and bind the target to it (istio.io/use-waypoint), or use a selector policy node proxies enforce"})
		case strings.HasPrefix(st.Message, translate.NotForMesh):
			out = append(out, finding{Code: codeGatewayProxy, Level: levelInfo, Object: obj, Message: "not applicable: " + strings.TrimPrefix(st.Message, translate.NotForMesh),
				Fix: "none for the mesh; add \"mesh\" to spec.gateways to apply it at waypoints too"})
		case strings.HasPrefix(st.Message, translate.EnforcedByWaypoint):
			// Working as designed: a waypoint enforces it.
		case !st.Sent && (st.Kind == "VirtualService" || st.Kind == "DestinationRule"):
			fix := "bind the service its hosts name to a waypoint (istio.io/use-waypoint), or remove it"
			if strings.Contains(st.Message, "Gateway API routes take precedence") {
				fix = "keep one kind of route per service: remove the VirtualService or the HTTPRoute/GRPCRoute"
			}
			out = append(out, finding{Code: codeRouteNotApplied, Level: levelWarning, Object: obj, Message: st.Message, Fix: fix})
		case !st.Sent && st.Kind == "RequestAuthentication" && len(st.Invalid) == 0:
			out = append(out, finding{Code: codeNotSent, Level: levelWarning, Object: obj, Message: st.Message,
				Fix: "attach it with targetRefs to a waypoint Gateway or a Service bound to one (node proxies cannot validate JWTs)"})
		case !st.Sent && st.Message != "" && len(st.Invalid) == 0:
			out = append(out, finding{Code: codeNotSent, Level: levelWarning, Object: obj, Message: st.Message,
				Fix: "rewrite the policy with what node proxies support, or remove it"})
		}
	}
	return out
}

// withoutInvalid drops the "invalid: ..." parts of a status message (each
// invalid value is its own finding).
func withoutInvalid(msg string) string {
	var keep []string
	for _, part := range strings.Split(msg, "; ") {
		if !strings.HasPrefix(part, "invalid: ") && !strings.HasPrefix(part, "spec.") {
			keep = append(keep, part)
		}
	}
	return strings.Join(keep, "; ")
}

// warningFindings passes on translation warnings about objects other than
// policies (policies are covered by their status).
func warningFindings(res *translate.Result) []finding {
	var out []finding
	for _, w := range res.Warnings {
		if strings.HasPrefix(w, "AuthorizationPolicy ") || strings.HasPrefix(w, "PeerAuthentication ") {
			continue
		}
		obj, msg, _ := strings.Cut(w, ": ")
		out = append(out, finding{Code: codeTranslationWarn, Level: levelWarning, Object: obj, Message: msg,
			Fix: "change the object as the message says"})
	}
	return out
}

func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// workloadLabels lists the label sets of pods and WorkloadEntries in ns
// ("" = every namespace).
func workloadLabels(objs *cluster.Objects, ns string) []map[string]string {
	var out []map[string]string
	for _, p := range objs.Pods {
		if ns == "" || p.Namespace == ns {
			out = append(out, p.Labels)
		}
	}
	for _, w := range objs.WorkloadEntries {
		if ns == "" || w.Namespace == ns {
			out = append(out, w.Spec.GetLabels())
		}
	}
	return out
}

// selectorFindings: AuthorizationPolicies and PeerAuthentications whose
// selector matches no pod or WorkloadEntry (a root-namespace policy selects
// in every namespace).
func selectorFindings(cfg translate.Config, objs *cluster.Objects) []finding {
	var out []finding
	check := func(kind, ns, name string, sel map[string]string) {
		if len(sel) == 0 {
			return
		}
		scope := ns
		if ns == cfg.RootNamespace {
			scope = ""
		}
		for _, l := range workloadLabels(objs, scope) {
			if matches(sel, l) {
				return
			}
		}
		out = append(out, finding{Code: codeSelectsNothing, Level: levelWarning, Object: kind + " " + ns + "/" + name,
			Message: fmt.Sprintf("selector %v matches no pod or WorkloadEntry; the policy applies to nothing", sel),
			Fix:     "fix spec.selector.matchLabels to the workloads' labels"})
	}
	for _, ap := range objs.AuthorizationPolicies {
		if len(ap.Spec.GetTargetRefs()) == 0 && ap.Spec.GetTargetRef() == nil {
			check("AuthorizationPolicy", ap.Namespace, ap.Name, ap.Spec.GetSelector().GetMatchLabels())
		}
	}
	for _, pa := range objs.PeerAuthentications {
		check("PeerAuthentication", pa.Namespace, pa.Name, pa.Spec.GetSelector().GetMatchLabels())
	}
	return out
}

// externalNameFindings: policies whose targetRef names an ExternalName
// Service; node proxies treat it as an alias of the service it names.
func externalNameFindings(objs *cluster.Objects) []finding {
	ext := map[string]string{}
	for _, s := range objs.Services {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			ext[s.Namespace+"/"+s.Name] = s.Spec.ExternalName
		}
	}
	var out []finding
	for _, ap := range objs.AuthorizationPolicies {
		refs := ap.Spec.GetTargetRefs()
		if r := ap.Spec.GetTargetRef(); r != nil {
			refs = append(refs, r)
		}
		for _, r := range refs {
			ns := or(r.GetNamespace(), ap.Namespace)
			if r.GetKind() != "Service" || r.GetGroup() != "" {
				continue
			}
			if target, ok := ext[ns+"/"+r.GetName()]; ok {
				out = append(out, finding{Code: codeExternalName, Level: levelWarning,
					Object:  "AuthorizationPolicy " + ap.Namespace + "/" + ap.Name,
					Message: fmt.Sprintf("targetRef Service %s/%s is an ExternalName alias of %s; traffic to it is the referenced service's", ns, r.GetName(), target),
					Fix:     "target the referenced service " + target + " instead"})
			}
		}
	}
	return out
}

// systemNamespaces are left out of the non-mesh client check.
var systemNamespaces = map[string]bool{"kube-system": true, "kube-public": true, "kube-node-lease": true}

// inAmbient reports whether a pod is enrolled the way local mode enrolls it.
func inAmbient(objs *cluster.Objects, p *corev1.Pod) bool {
	if p.Spec.HostNetwork || p.Annotations[translate.AnnotationSidecarStatus] != "" {
		return false
	}
	if v, ok := p.Labels[translate.LabelDataplaneMode]; ok {
		return v == "ambient"
	}
	if p.Annotations[translate.AnnotationRedirection] == "enabled" {
		return true
	}
	ns := objs.Namespace(p.Namespace)
	return ns != nil && ns.Labels[translate.LabelDataplaneMode] == "ambient"
}

// isWaypointPod reports whether p is a waypoint's: it carries the waypoint
// controller's managed label, or its gateway-name label names an
// istio-waypoint Gateway of its namespace.
func isWaypointPod(objs *cluster.Objects, p *corev1.Pod) bool {
	if p.Labels[translate.LabelGatewayManaged] == translate.ManagedMeshController {
		return true
	}
	gw, ok := p.Labels[translate.LabelGatewayName]
	if !ok {
		return false
	}
	for _, g := range objs.Gateways {
		if g.Namespace == p.Namespace && g.Name == gw && string(g.Spec.GatewayClassName) == translate.WaypointClass {
			return true
		}
	}
	return false
}

// strictFindings: STRICT PeerAuthentications while pods outside the mesh
// exist; their plaintext connections to the STRICT workloads are refused.
func strictFindings(cfg translate.Config, objs *cluster.Objects) []finding {
	outside := map[string]bool{}
	for _, p := range objs.Pods {
		// System namespaces' pods (DNS, the control plane) rarely call
		// application workloads; counting them would flag every cluster.
		if systemNamespaces[p.Namespace] || p.Namespace == cfg.RootNamespace {
			continue
		}
		// A waypoint is not captured (istio.io/dataplane-mode: none) but is
		// in the mesh: it terminates and originates HBONE itself.
		if !inAmbient(objs, p) && !p.Spec.HostNetwork && !isWaypointPod(objs, p) {
			outside[p.Namespace] = true
		}
	}
	if len(outside) == 0 {
		return nil
	}
	var nss []string
	for ns := range outside {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	var out []finding
	for _, pa := range objs.PeerAuthentications {
		if pa.Spec.GetMtls().GetMode() != securityv1beta1.PeerAuthentication_MutualTLS_STRICT {
			continue
		}
		scope := "namespace " + pa.Namespace
		if sel := pa.Spec.GetSelector().GetMatchLabels(); len(sel) > 0 {
			scope = fmt.Sprintf("workloads %v in namespace %s", sel, pa.Namespace)
		} else if pa.Namespace == cfg.RootNamespace && len(pa.Spec.GetSelector().GetMatchLabels()) == 0 {
			scope = "the whole mesh"
		}
		out = append(out, finding{Code: codeStrictNonMesh, Level: levelWarning, Object: "PeerAuthentication " + pa.Namespace + "/" + pa.Name,
			Message: fmt.Sprintf("STRICT mTLS for %s while pods outside the mesh run in %s; their plaintext connections are refused", scope, strings.Join(nss, ", ")),
			Fix:     "enroll those namespaces (istio.io/dataplane-mode=ambient), or use PERMISSIVE until they are"})
	}
	return out
}

// serviceEntryFindings: ServiceEntries that need an auto-allocated address
// and have none in status.addresses yet.
func serviceEntryFindings(objs *cluster.Objects) []finding {
	var out []finding
	for _, se := range objs.ServiceEntries {
		for _, h := range se.Spec.GetHosts() {
			if !autoalloc.Eligible(se, h) {
				continue
			}
			found := false
			for _, a := range se.Status.GetAddresses() {
				found = found || a.GetHost() == h
			}
			if !found {
				out = append(out, finding{Code: codeSENoAddress, Level: levelWarning, Object: "ServiceEntry " + se.Namespace + "/" + se.Name,
					Message: "host " + h + " has no auto-allocated address in status.addresses yet; until the control plane writes one, node proxies cannot capture it by address",
					Fix:     "run the control plane with auto-allocation (it writes status.addresses), or set spec.addresses"})
			}
		}
	}
	return out
}

// writeFindings prints fs as a table, JSON or YAML.
func writeFindings(w io.Writer, dir string, fs []finding, format string) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(struct {
			Findings []finding `json:"findings"`
		}{fs}, "", "  ")
		if err != nil {
			return fmt.Errorf("analyze: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(struct {
			Findings []finding `json:"findings"`
		}{fs})
		if err != nil {
			return fmt.Errorf("analyze: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	if len(fs) == 0 {
		_, err := fmt.Fprintf(w, "✔ no problems found in %s\n", dir)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tLEVEL\tOBJECT\tMESSAGE\tFIX")
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Code, f.Level, f.Object, f.Message, f.Fix)
	}
	return tw.Flush()
}

// runAnalyze is `zctl analyze [flags] [DIR]`: a directory of YAML, or the
// live cluster (--kubeconfig, --in-cluster); the node agents' /pods add the
// pods' capture rules.
func runAnalyze(out io.Writer, o options, pos []string) error {
	switch o.output {
	case "table", "json", "yaml":
	default:
		return fmt.Errorf("unknown output format %q (want table, json or yaml)", o.output)
	}
	live := o.kubeconfig != "" || o.inCluster
	switch {
	case len(pos) > 1, len(pos) == 1 && live:
		return errors.New("analyze wants one directory of YAML, or --kubeconfig FILE or --in-cluster for the live cluster")
	case len(pos) == 0 && !live:
		return errors.New("analyze wants a directory of YAML, or --kubeconfig FILE or --in-cluster for the live cluster")
	}
	pods, err := loadAgentPods(o.agentAdmins, o.agentFiles)
	if err != nil {
		return err
	}
	var (
		fs     []finding
		source string
	)
	if live {
		fs, source, err = analyzeCluster(o.kubeconfig, pods)
	} else {
		source = pos[0]
		var src *local.Source
		src, err = loadDir(source)
		if err == nil {
			objs, _ := src.Current()
			fs = analyzeObjects(objs, source, src.Errors(), pods)
		}
	}
	if err != nil {
		return err
	}
	if err := writeFindings(out, source, fs, o.output); err != nil {
		return err
	}
	for _, f := range fs {
		if f.Level == levelError {
			return errFindings
		}
	}
	return nil
}
