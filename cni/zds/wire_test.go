package zds

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
)

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func reqAdd(uid string) *zdsapi.WorkloadRequest {
	return addRequest(uid, &zdsapi.WorkloadInfo{Name: "app", Namespace: "default", ServiceAccount: "sa"})
}

func reqKeep(uid string) *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Keep{Keep: &zdsapi.KeepWorkload{Uid: uid}}}
}

func reqDel(uid string) *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_Del{Del: &zdsapi.DelWorkload{Uid: uid}}}
}

func reqSnapshotSent() *zdsapi.WorkloadRequest {
	return &zdsapi.WorkloadRequest{Payload: &zdsapi.WorkloadRequest_SnapshotSent{SnapshotSent: &zdsapi.SnapshotSent{}}}
}

func TestDecodeRequestAndFDRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []byte
		fds     int
		wantErr error // nil: valid
		payload string
	}{
		{"add with one fd", marshal(t, reqAdd("u1")), 1, nil, "add"},
		{"add without fd", marshal(t, reqAdd("u1")), 0, ErrProtocol, ""},
		{"add with two fds", marshal(t, reqAdd("u1")), 2, ErrProtocol, ""},
		{"add without uid", marshal(t, reqAdd("")), 1, ErrProtocol, ""},
		{"keep", marshal(t, reqKeep("u2")), 0, nil, "keep"},
		{"keep with fd", marshal(t, reqKeep("u2")), 1, ErrProtocol, ""},
		{"del", marshal(t, reqDel("u3")), 0, nil, "del"},
		{"del with fd", marshal(t, reqDel("u3")), 1, ErrProtocol, ""},
		{"del without uid", marshal(t, reqDel("")), 0, ErrProtocol, ""},
		{"snapshot_sent", marshal(t, reqSnapshotSent()), 0, nil, "snapshot_sent"},
		{"snapshot_sent with fd", marshal(t, reqSnapshotSent()), 1, ErrProtocol, ""},
		{"empty request", nil, 0, ErrProtocol, ""},
		{"unknown field only", []byte{0x30, 0x01}, 0, ErrProtocol, ""},
		{"garbage", []byte{0xff, 0xff, 0xff}, 0, nil, ""}, // decode error, not ErrProtocol
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := DecodeRequest(tc.in)
			if err == nil {
				err = checkFDs(req, tc.fds)
			}
			switch {
			case tc.payload != "":
				if err != nil {
					t.Fatalf("err = %v, want valid", err)
				}
				if got := payloadName(req); got != tc.payload {
					t.Fatalf("payload %s, want %s", got, tc.payload)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			default:
				if err == nil {
					t.Fatal("garbage accepted")
				}
			}
		})
	}
}

func TestDecodeAck(t *testing.T) {
	var nack *NackError
	if err := decodeAck(marshal(t, ack(nil))); err != nil {
		t.Fatalf("ACK: %v", err)
	}
	if err := decodeAck(marshal(t, ack(errors.New("no such pod")))); !errors.As(err, &nack) || nack.Reason != "no such pod" {
		t.Fatalf("NACK: %v", err)
	}
	if err := decodeAck(nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("empty response: %v, want ErrProtocol", err)
	}
	if err := decodeAck([]byte{0x0a, 0x05}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("truncated response: %v, want ErrProtocol", err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, m := range []*zdsapi.WorkloadRequest{reqAdd("6a1f0f6e-0000-4000-8000-000000000001"), reqKeep("k"), reqDel("d"), reqSnapshotSent()} {
		f.Add(marshal(f, m), uint8(0))
		f.Add(marshal(f, m), uint8(1))
	}
	f.Add([]byte{}, uint8(0))
	f.Add([]byte{0x0a, 0x80}, uint8(1))
	f.Add([]byte{0x2a, 0x00}, uint8(2)) // reserved field 4
	f.Fuzz(func(t *testing.T, b []byte, nfds uint8) {
		req, err := DecodeRequest(b)
		if err != nil {
			return
		}
		if req.GetPayload() == nil {
			t.Fatal("accepted a request without payload")
		}
		fdErr := checkFDs(req, int(nfds))
		wantOK := nfds == 0
		if req.GetAdd() != nil {
			wantOK = nfds == 1
		}
		if (fdErr == nil) != wantOK {
			t.Fatalf("checkFDs(%s, %d) = %v", payloadName(req), nfds, fdErr)
		}
		again, err := DecodeRequest(marshal(t, req))
		if err != nil {
			t.Fatalf("re-encoded request rejected: %v", err)
		}
		if !proto.Equal(req, again) {
			t.Fatalf("round trip changed %v into %v", req, again)
		}
	})
}
