package xdsserver

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/workloadapi"

	"github.com/ztunnel-go/ztunnel-go/internal/xds"
)

func TestSetResourcesVersions(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	s := NewServer(ServerConfig{Log: zap.New(core)})
	a := workload("a", "10.0.0.1")
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		typeURL string
		set     map[string]proto.Message
		want    map[string]string
		wantLog string
	}{
		{name: "version is the hash of the deterministic encoding", typeURL: xds.AddressType,
			set:  map[string]proto.Message{"a": a},
			want: map[string]string{"a": sha256hex(b)}},
		{name: "nil message keeps the old version", typeURL: xds.AddressType,
			set:     map[string]proto.Message{"a": nil},
			want:    map[string]string{"a": sha256hex(b)},
			wantLog: "resource not served"},
		{name: "nil map removes all", typeURL: xds.AddressType,
			want: map[string]string{}},
		{name: "invalid UTF-8 is not served", typeURL: xds.AddressType,
			set: map[string]proto.Message{"u": &workloadapi.Address{Type: &workloadapi.Address_Workload{
				Workload: &workloadapi.Workload{Uid: "\xff"}}}},
			want:    map[string]string{},
			wantLog: "resource not served"},
		{name: "unknown type is ignored", typeURL: "type.googleapis.com/other",
			set:     map[string]proto.Message{"a": a},
			wantLog: "unknown type URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := logs.Len()
			s.SetResources(tt.typeURL, tt.set)
			if got := s.Versions(tt.typeURL); !maps.Equal(got, tt.want) {
				t.Errorf("Versions = %v, want %v", got, tt.want)
			}
			got := logs.All()[before:]
			switch {
			case tt.wantLog == "" && len(got) > 0:
				t.Errorf("unexpected log %q", got[0].Message)
			case tt.wantLog != "" && (len(got) != 1 || !strings.Contains(got[0].Message, tt.wantLog)):
				t.Errorf("logs %v, want one containing %q", got, tt.wantLog)
			}
		})
	}
}

func sha256hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestServerReadyAfterBothTypes(t *testing.T) {
	s := NewServer(ServerConfig{})
	s.SetResources(xds.AddressType, nil)
	select {
	case <-s.ready:
		t.Fatal("ready after one type")
	default:
	}
	s.SetResources(xds.AuthorizationType, nil)
	s.SetResources(xds.AuthorizationType, nil) // again: must not close twice
	select {
	case <-s.ready:
	default:
		t.Fatal("not ready after both types")
	}
}
