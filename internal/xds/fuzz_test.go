package xds

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/securityapi"
	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"
)

// FuzzHandleResponse feeds arbitrary bytes to the client's response decoder
// and handler. Whatever the generated type decodes, the client's decoder must
// decode to the same fields (it may accept more: it does not look inside the
// fields it skips). The handler must not panic, must echo type and nonce,
// must NACK every resource it cannot decode with a message naming it, and
// must not record a version for a rejected resource.
func FuzzHandleResponse(f *testing.F) {
	seeds := []*discovery.DeltaDiscoveryResponse{
		{TypeUrl: AddressType, Nonce: "1", Resources: []*discovery.Resource{
			res(f, "a", "v1", workload("a", "10.0.0.1")),
			res(f, "bad-1", "v1", workload("bad-1", "10.0.0.2")),
		}, RemovedResources: []string{"gone"}},
		{TypeUrl: AuthorizationType, Nonce: "2", Resources: []*discovery.Resource{
			res(f, "ns/p", "v1", policy("ns", "p")),
			rawRes("ns/q", "v1", AuthorizationType, []byte{0x0a, 0xff}),
		}},
		{TypeUrl: AddressType, Resources: []*discovery.Resource{
			res(f, "p", "v1", policy("ns", "p")),
			{Name: "nobody"},
			res(f, "", "", workload("a", "10.0.0.1")),
		}},
		{TypeUrl: "type.googleapis.com/unknown"},
		{},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0x01})

	f.Fuzz(func(t *testing.T, data []byte) {
		ours := &deltaResponse{}
		ourErr := ours.unmarshal(data)
		resp := &discovery.DeltaDiscoveryResponse{}
		if err := proto.Unmarshal(data, resp); err != nil {
			return // not a response at all: the gRPC codec rejects it earlier
		}
		if ourErr != nil {
			t.Fatalf("the generated type decodes what the client rejects: %v", ourErr)
		}
		if w := want(resp); !reflect.DeepEqual(normal(ours), w) {
			t.Fatalf("decoded as %+v, the generated type reads %+v", normal(ours), w)
		}
		h := newHandler(newFakeSink())
		ack := toProto(t, h.handle(ours))
		if ack.GetTypeUrl() != resp.GetTypeUrl() || ack.GetResponseNonce() != resp.GetNonce() {
			t.Fatalf("ack echoes {%q %q}, want {%q %q}", ack.GetTypeUrl(), ack.GetResponseNonce(), resp.GetTypeUrl(), resp.GetNonce())
		}
		msg := ack.GetErrorDetail().GetMessage()
		typ := resp.GetTypeUrl()
		if typ != AddressType && typ != AuthorizationType {
			if ack.GetErrorDetail() == nil || msg == "" {
				t.Fatalf("unknown type %q was ACKed", typ)
			}
			return
		}
		held := h.resourceVersions(typ)
		for _, r := range resp.GetResources() {
			reason := rejectReason(typ, r)
			if reason == "" {
				continue
			}
			if ack.GetErrorDetail() == nil || !strings.Contains(msg, strconv.Quote(r.GetName())) {
				t.Fatalf("resource %q (%s) not named in NACK %q", r.GetName(), reason, msg)
			}
			if _, ok := held[r.GetName()]; ok {
				t.Fatalf("rejected resource %q got a version", r.GetName())
			}
		}
	})
}

// rejectReason says why the handler must reject r, independently of it.
func rejectReason(typ string, r *discovery.Resource) string {
	var m proto.Message = &workloadapi.Address{}
	if typ == AuthorizationType {
		m = &securityapi.Authorization{}
	}
	switch {
	case r.GetName() == "":
		return "no name"
	case r.GetResource() == nil:
		return "no body"
	case r.GetResource().GetTypeUrl() != typ:
		return "wrong type"
	case proto.Unmarshal(r.GetResource().GetValue(), m) != nil:
		return "undecodable"
	case strings.HasPrefix(r.GetName(), "bad"):
		return "refused by the sink"
	}
	return ""
}
