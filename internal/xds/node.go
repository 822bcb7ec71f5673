package xds

import (
	"errors"
	"maps"
	"strings"
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

// encode encodes the envoy.config.core.v3.Node sent in the first request of
// each stream: the id and the metadata, all strings.
func (n NodeInfo) encode() []byte {
	md := make(map[string]string, len(n.Metadata)+4)
	maps.Copy(md, n.Metadata)
	md["NAME"] = n.PodName
	md["NAMESPACE"] = n.PodNamespace
	md["INSTANCE_IPS"] = strings.Join(n.InstanceIPs, ",")
	md["NODE_NAME"] = n.NodeName
	return encodeNode(n.ID(), md)
}
