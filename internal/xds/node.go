package xds

import (
	"errors"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// NodeInfo describes the ztunnel instance to the control plane.
type NodeInfo struct {
	PodName      string   // required
	PodNamespace string   // required
	NodeName     string   // Kubernetes node; "" is sent as ""
	InstanceIPs  []string // required; the first one goes into the node id
	// Metadata holds extra string metadata (ProxyConfig proxyMetadata,
	// ISTIO_META_* values). NAME, NAMESPACE, INSTANCE_IPS and NODE_NAME are
	// always set from the fields above and win over keys here. nil: none.
	Metadata map[string]string
}

func (n NodeInfo) validate() error {
	var errs []error
	if n.PodName == "" {
		errs = append(errs, errors.New("node: PodName is required"))
	}
	if n.PodNamespace == "" {
		errs = append(errs, errors.New("node: PodNamespace is required"))
	}
	if len(n.InstanceIPs) == 0 || n.InstanceIPs[0] == "" {
		errs = append(errs, errors.New("node: InstanceIPs is required"))
	}
	return errors.Join(errs...)
}

// ID is the xDS node id istiod expects from ztunnel:
// ztunnel~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local.
func (n NodeInfo) ID() string {
	ip := ""
	if len(n.InstanceIPs) > 0 {
		ip = n.InstanceIPs[0]
	}
	return "ztunnel~" + ip + "~" + n.PodName + "." + n.PodNamespace + "~" + n.PodNamespace + ".svc.cluster.local"
}

func (n NodeInfo) proto() *core.Node {
	fields := make(map[string]*structpb.Value, len(n.Metadata)+4)
	for k, v := range n.Metadata {
		fields[k] = structpb.NewStringValue(v)
	}
	fields["NAME"] = structpb.NewStringValue(n.PodName)
	fields["NAMESPACE"] = structpb.NewStringValue(n.PodNamespace)
	fields["INSTANCE_IPS"] = structpb.NewStringValue(strings.Join(n.InstanceIPs, ","))
	fields["NODE_NAME"] = structpb.NewStringValue(n.NodeName)
	return &core.Node{Id: n.ID(), Metadata: &structpb.Struct{Fields: fields}}
}
