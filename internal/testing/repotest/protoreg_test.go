package repotest

import (
	"testing"

	// Our generated API packages register Istio's protobuf names
	// (istio.workload.*, istio.security.*, istio.v1.auth.*). Linking them with
	// the Istio and Kubernetes type packages the control plane reads must not
	// register any name twice: protobuf-go panics at init when it does, so
	// this test binary failing to start is the signal.
	_ "github.com/ztunnel-go/ztunnel-go/internal/api/caapi"
	_ "github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	_ "github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
	_ "github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	_ "github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

func TestProtoNamesRegisteredOnce(t *testing.T) {
	// Reaching here means init did not panic.
}
