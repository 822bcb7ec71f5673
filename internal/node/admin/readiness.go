package admin

// Readiness task names, as Istio's ztunnel reports them (the node proxy's
// daemon.Readiness tasks).
const (
	TaskStateManager         = "state manager"
	TaskWorkloadProxyManager = "workload proxy manager"
)
