// Package dnsproxy is the node proxy's per-pod DNS server (reference
// docs/protocol.md#dns): one Server per captured pod, on UDP and TCP port
// 15053 inside the pod's network namespace, where the pod's capture rules
// redirect its DNS. It answers A and AAAA queries for mesh names (Kubernetes
// services with the pod's search-domain expansion, ServiceEntry hosts with
// specified or auto-allocated addresses, wildcard hosts, headless services,
// ExternalName aliases) from the node's state snapshot, and forwards
// everything else verbatim to the node proxy's own upstream resolvers through
// sockets created in the pod's namespace with ztunnel's mark, so they are not
// captured again.
//
// Deciding is separate from doing: Resolver.Resolve is a pure function of a
// snapshot, the client workload and the query (table-tested); Server parses,
// validates, answers, forwards and records; Forwarder holds the upstream
// configuration shared by every pod's server.
//
// It is not a recursive resolver and not a cache, it does not decide whether a
// pod's DNS is captured (that is cni/rules and the pod's annotations) and it
// does not manage pods: the in-pod manager creates and closes one Server per
// pod with the pod's other listeners.
package dnsproxy
