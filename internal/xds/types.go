package xds

import (
	"sort"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// Type URLs of the two resource types ztunnel consumes.
const (
	AddressType       = "type.googleapis.com/istio.workload.Address"
	AuthorizationType = "type.googleapis.com/istio.security.Authorization"
)

// WaypointType is ztunnel-go's own waypoint configuration (internal/api/
// waypointapi). A client subscribes to it only when ClientConfig.Waypoint is
// set, and then to that one resource name; node proxies never receive it.
const WaypointType = waypointapi.TypeURL

// typeURLs is the order in which the client subscribes.
var typeURLs = [...]string{AddressType, AuthorizationType}

// WaypointSink is what a Sink also implements when the client subscribes to
// WaypointType (ClientConfig.Waypoint). Errors are handled as Sink's.
type WaypointSink interface {
	ApplyWaypoints(upserts map[string]*waypointapi.Config, removes []string) error
}

// Sink receives decoded resources. internal/node/state implements it. Each call
// carries one xDS response of one type: upserts by resource name and the names
// to remove. The Sink applies every resource it can; a non-nil error makes the
// client NACK the response with the error's message.
//
// If the error (or one it wraps) has a method RejectedNames() []string (see
// ResourceErrors), only those resources count as rejected: the client keeps
// their previously accepted versions and records the versions of the others.
// Any other error counts every upsert of the call as rejected, which is safe:
// the server then resends them after a reconnect.
type Sink interface {
	ApplyAddresses(upserts map[string]*workloadapi.Address, removes []string) error
	ApplyAuthorizations(upserts map[string]*securityapi.Authorization, removes []string) error
}

// rejectedNamer is what the client looks for (errors.As) in a Sink error.
type rejectedNamer interface {
	RejectedNames() []string
}

// ResourceErrors maps resource names to why each was rejected. It is the error
// the client builds for resources it cannot decode, and a Sink may return it
// so that the client knows which resources it refused.
type ResourceErrors map[string]error

// Error lists the rejections sorted by name: `"name": reason; ...`.
func (e ResourceErrors) Error() string {
	names := e.RejectedNames()
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(strconv.Quote(n))
		b.WriteString(": ")
		if err := e[n]; err != nil {
			b.WriteString(err.Error())
		} else {
			b.WriteString("rejected")
		}
	}
	return b.String()
}

// RejectedNames returns the rejected resource names, sorted.
func (e ResourceErrors) RejectedNames() []string {
	names := make([]string, 0, len(e))
	for n := range e {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
