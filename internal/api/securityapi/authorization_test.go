package securityapi

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/apitest"
)

// contract is the wire contract with Istio's istio.security package.
var contract = apitest.Contract{
	Package: "istio.security",
	Messages: map[string]map[string]protoreflect.FieldNumber{
		"Authorization": {
			"name": 1, "namespace": 2, "scope": 3, "action": 4, "rules": 5, "dry_run": 6, "extensions": 7,
		},
		"Rule":   {"clauses": 1},
		"Clause": {"matches": 2},
		"Match": {
			"namespaces": 1, "not_namespaces": 2, "principals": 3, "not_principals": 4,
			"source_ips": 5, "not_source_ips": 6, "destination_ips": 7, "not_destination_ips": 8,
			"destination_ports": 9, "not_destination_ports": 10,
			"service_accounts": 11, "not_service_accounts": 12, "extensions": 13,
		},
		"Address":             {"address": 1, "length": 2},
		"ServiceAccountMatch": {"namespace": 1, "serviceAccount": 2},
		"StringMatch":         {"exact": 1, "prefix": 2, "suffix": 3, "presence": 4},
		"Extension":           {"name": 1, "config": 2},
	},
	Enums: map[string]map[string]protoreflect.EnumNumber{
		"Scope": {"GLOBAL": 0, "NAMESPACE": 1, "WORKLOAD_SELECTOR": 2},
		// No AUDIT or CUSTOM: Istio's wire enum has neither.
		"Action": {"ALLOW": 0, "DENY": 1},
	},
}

func TestWireContract(t *testing.T) {
	apitest.CheckContract(t, File_securityapi_authorization_proto, contract)
}

func fullMatch() *Match {
	cidr := []*Address{{Address: []byte{10, 0, 0, 0}, Length: 8}}
	sa := []*ServiceAccountMatch{{Namespace: "default", ServiceAccount: "app"}}
	return &Match{
		Namespaces:          []*StringMatch{{MatchType: &StringMatch_Exact{Exact: "default"}}},
		NotNamespaces:       []*StringMatch{{MatchType: &StringMatch_Prefix{Prefix: "kube-"}}},
		Principals:          []*StringMatch{{MatchType: &StringMatch_Suffix{Suffix: "/sa/app"}}},
		NotPrincipals:       []*StringMatch{{MatchType: &StringMatch_Presence{Presence: &emptypb.Empty{}}}},
		SourceIps:           cidr,
		NotSourceIps:        cidr,
		DestinationIps:      cidr,
		NotDestinationIps:   cidr,
		DestinationPorts:    []uint32{8080},
		NotDestinationPorts: []uint32{9090},
		ServiceAccounts:     sa,
		NotServiceAccounts:  sa,
		Extensions:          []*Extension{{Name: "e"}},
	}
}

func fullAuthorization() *Authorization {
	return &Authorization{
		Name:       "allow-app",
		Namespace:  "default",
		Scope:      Scope_WORKLOAD_SELECTOR,
		Action:     Action_DENY,
		Rules:      []*Rule{{Clauses: []*Clause{{Matches: []*Match{fullMatch()}}}}},
		DryRun:     true,
		Extensions: []*Extension{{Name: "e"}},
	}
}

func TestRoundTrip(t *testing.T) {
	apitest.CheckPopulated(t, fullAuthorization())
	apitest.CheckPopulated(t, fullMatch())
	apitest.RoundTrip(t, fullAuthorization())
}

func TestWireNumbers(t *testing.T) {
	b := apitest.RoundTrip(t, fullAuthorization())
	// rules is field 5 (Istio's "groups"), dry_run 6.
	apitest.WantOnWire(t, b, map[protowire.Number]protowire.Type{
		3: protowire.VarintType, 4: protowire.VarintType, 5: protowire.BytesType, 6: protowire.VarintType,
	})
	// Clause.matches is field 2, not 1.
	cb := apitest.RoundTrip(t, &Clause{Matches: []*Match{{DestinationPorts: []uint32{1}}}})
	apitest.WantOnWire(t, cb, map[protowire.Number]protowire.Type{2: protowire.BytesType})
	// Repeated scalars are packed (proto3 default), as Istio sends them.
	mb := apitest.RoundTrip(t, &Match{DestinationPorts: []uint32{80, 443}})
	apitest.WantOnWire(t, mb, map[protowire.Number]protowire.Type{9: protowire.BytesType})
}

// TestDryRunWire: dry_run is field 6, varint, as Istio's ztunnel reads it
// (tag byte 6<<3|0 = 0x30). The bytes are built by hand, not by this
// package, so a renumbering here cannot pass by agreeing with itself.
func TestDryRunWire(t *testing.T) {
	b, err := proto.Marshal(&Authorization{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{0x30, 0x01}; !bytes.Equal(b, want) {
		t.Errorf("Authorization{dry_run: true} = % x, want % x", b, want)
	}
	istiod := protowire.AppendTag(nil, 1, protowire.BytesType)
	istiod = protowire.AppendString(istiod, "p")
	istiod = protowire.AppendTag(istiod, 6, protowire.VarintType)
	istiod = protowire.AppendVarint(istiod, 1)
	var a Authorization
	if err := proto.Unmarshal(istiod, &a); err != nil {
		t.Fatal(err)
	}
	if !a.GetDryRun() || a.GetName() != "p" {
		t.Errorf("decoded %v, want name p with dry_run", &a)
	}
}
