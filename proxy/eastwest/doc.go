// Package eastwest is ztunnel-go's east-west gateway, the data path of a
// Gateway of class istio-east-west in Istio ambient multi-network
// multicluster. A node proxy on another network reaches a service here in
// double HBONE: an outer HBONE CONNECT (mutual TLS 1.3, HTTP/2, port
// 15008) to this gateway whose :authority is the service's
// hostname:port, and inside that stream an inner HBONE connection meant
// for the destination's node proxy or the service's waypoint.
//
// The gateway terminates only the outer tunnel. It forwards the inner
// bytes unread to one destination it chooses on its own network (Route):
// the service's waypoint if it has one, else a healthy HBONE endpoint's
// node proxy at the endpoint's IP and port 15008. It serves only services
// of global scope (state.Service.Global). It authorizes nothing beyond
// the client's certificate (any identity in the trust domain), as Istio's
// gateway does: the inner connection is authorized by its destination.
//
// It is not a waypoint (no L7, no policy), not an ingress gateway (it
// never speaks plaintext to an application), and it does not translate
// the Gateway into the workload API (internal/controlplane does).
package eastwest
