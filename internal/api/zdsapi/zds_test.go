package zdsapi

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/apitest"
)

// contract is the wire contract with Istio's istio.workload.zds package. Note
// the irregular numbers: DelWorkload.uid is 2 and WorkloadRequest.keep is 5.
var contract = apitest.Contract{
	Package: "istio.workload.zds",
	Messages: map[string]map[string]protoreflect.FieldNumber{
		"ZdsHello":         {"version": 1},
		"WorkloadInfo":     {"name": 1, "namespace": 2, "service_account": 3},
		"AddWorkload":      {"uid": 1, "workload_info": 2},
		"KeepWorkload":     {"uid": 1},
		"DelWorkload":      {"uid": 2},
		"SnapshotSent":     {},
		"Ack":              {"error": 1},
		"WorkloadRequest":  {"add": 1, "del": 2, "snapshot_sent": 3, "keep": 5},
		"WorkloadResponse": {"ack": 1},
	},
	Enums: map[string]map[string]protoreflect.EnumNumber{
		"Version": {"NOT_USED": 0, "V1": 1},
	},
}

func TestWireContract(t *testing.T) {
	apitest.CheckContract(t, File_zdsapi_zds_proto, contract)
}

func TestRoundTrip(t *testing.T) {
	add := &AddWorkload{
		Uid:          "6a1f0f6e-0000-4000-8000-000000000001",
		WorkloadInfo: &WorkloadInfo{Name: "app-1", Namespace: "default", ServiceAccount: "app"},
	}
	apitest.CheckPopulated(t, add)
	apitest.CheckPopulated(t, add.WorkloadInfo)
	for _, m := range []proto.Message{
		&ZdsHello{Version: Version_V1},
		&WorkloadRequest{Payload: &WorkloadRequest_Add{Add: add}},
		&WorkloadRequest{Payload: &WorkloadRequest_Keep{Keep: &KeepWorkload{Uid: "u"}}},
		&WorkloadRequest{Payload: &WorkloadRequest_Del{Del: &DelWorkload{Uid: "u"}}},
		&WorkloadRequest{Payload: &WorkloadRequest_SnapshotSent{SnapshotSent: &SnapshotSent{}}},
		&WorkloadResponse{Payload: &WorkloadResponse_Ack{Ack: &Ack{Error: "boom"}}},
	} {
		apitest.RoundTrip(t, m)
	}
}

func TestWireNumbers(t *testing.T) {
	bytesField := func(n protowire.Number) map[protowire.Number]protowire.Type {
		return map[protowire.Number]protowire.Type{n: protowire.BytesType}
	}
	apitest.WantOnWire(t, apitest.RoundTrip(t, &AddWorkload{Uid: "u", WorkloadInfo: &WorkloadInfo{Name: "n"}}),
		map[protowire.Number]protowire.Type{1: protowire.BytesType, 2: protowire.BytesType})
	apitest.WantOnWire(t, apitest.RoundTrip(t, &DelWorkload{Uid: "u"}), bytesField(2))
	apitest.WantOnWire(t, apitest.RoundTrip(t, &WorkloadRequest{Payload: &WorkloadRequest_Keep{Keep: &KeepWorkload{}}}), bytesField(5))
	apitest.WantOnWire(t, apitest.RoundTrip(t, &WorkloadRequest{Payload: &WorkloadRequest_SnapshotSent{SnapshotSent: &SnapshotSent{}}}), bytesField(3))
	apitest.WantOnWire(t, apitest.RoundTrip(t, &ZdsHello{Version: Version_V1}),
		map[protowire.Number]protowire.Type{1: protowire.VarintType})

	// An exact byte check of the hello ztunnel sends first: field 1 varint 1.
	b, err := proto.Marshal(&ZdsHello{Version: Version_V1})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "\x08\x01" {
		t.Errorf("ZdsHello{V1} = %x, want 0801", b)
	}
}
