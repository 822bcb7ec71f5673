package caapi

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/apitest"
)

// contract is the wire contract with Istio's istio.v1.auth package.
var contract = apitest.Contract{
	Package: "istio.v1.auth",
	Messages: map[string]map[string]protoreflect.FieldNumber{
		"IstioCertificateRequest":  {"csr": 1, "validity_duration": 3, "metadata": 4},
		"IstioCertificateResponse": {"cert_chain": 1},
	},
}

func TestWireContract(t *testing.T) {
	apitest.CheckContract(t, File_caapi_ca_proto, contract)
	// The gRPC method path is part of the contract too.
	if IstioCertificateService_CreateCertificate_FullMethodName != "/istio.v1.auth.IstioCertificateService/CreateCertificate" {
		t.Errorf("method path = %q", IstioCertificateService_CreateCertificate_FullMethodName)
	}
}

func TestRoundTrip(t *testing.T) {
	md, err := structpb.NewStruct(map[string]any{"ImpersonatedIdentity": "spiffe://cluster.local/ns/default/sa/app"})
	if err != nil {
		t.Fatal(err)
	}
	req := &IstioCertificateRequest{
		Csr:              "-----BEGIN CERTIFICATE REQUEST-----\n...",
		ValidityDuration: 86400,
		Metadata:         md,
	}
	apitest.CheckPopulated(t, req)
	b := apitest.RoundTrip(t, req)
	apitest.WantOnWire(t, b, map[protowire.Number]protowire.Type{
		1: protowire.BytesType, 3: protowire.VarintType, 4: protowire.BytesType,
	})

	resp := &IstioCertificateResponse{CertChain: []string{"leaf", "intermediate", "root"}}
	apitest.CheckPopulated(t, resp)
	apitest.WantOnWire(t, apitest.RoundTrip(t, resp), map[protowire.Number]protowire.Type{1: protowire.BytesType})
}
