package proxy

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestAppendProxyV2 compares with headers written out byte by byte from
// HAProxy's proxy-protocol.txt section 2.2.
func TestAppendProxyV2(t *testing.T) {
	sig := []byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}
	id := "spiffe://cluster.local/ns/apps/sa/client" // 40 bytes
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name     string
		src, dst string
		tlvs     []ProxyV2TLV
		want     []byte
	}{
		{"tcp4 with identity", "10.0.0.1:43210", "10.96.0.5:80",
			[]ProxyV2TLV{{ProxyV2TLVPeerIdentity, []byte(id)}},
			cat(sig, []byte{
				0x21,       // version 2, PROXY
				0x11,       // TCP over IPv4
				0x00, 0x37, // 12 address bytes + 3 + 40 TLV bytes = 55
				10, 0, 0, 1, // source address
				10, 96, 0, 5, // destination address
				0xA8, 0xCA, // source port 43210
				0x00, 0x50, // destination port 80
				0xD0, 0x00, 0x28, // TLV type 0xD0, length 40
			}, []byte(id))},
		{"tcp4 without TLVs", "192.0.2.1:1", "198.51.100.2:65535", nil,
			cat(sig, []byte{0x21, 0x11, 0x00, 0x0C, 192, 0, 2, 1, 198, 51, 100, 2, 0x00, 0x01, 0xFF, 0xFF})},
		{"tcp6 with two TLVs", "[fd00::1]:8080", "[fd00::2]:9080", []ProxyV2TLV{{0xD0, []byte("x")}, {0xE0, nil}},
			cat(sig, []byte{
				0x21,       // version 2, PROXY
				0x21,       // TCP over IPv6
				0x00, 0x2B, // 36 address bytes + (3+1) + (3+0) TLV bytes = 43
			},
				[]byte{0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
				[]byte{0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},
				[]byte{0x1F, 0x90, 0x23, 0x78}, // ports 8080, 9080
				[]byte{0xD0, 0x00, 0x01, 'x'},
				[]byte{0xE0, 0x00, 0x00})},
		{"mixed families are written as IPv6, v4-mapped", "10.0.0.1:1000", "[fd00::2]:2000", nil,
			cat(sig, []byte{0x21, 0x21, 0x00, 0x24},
				[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1},
				[]byte{0xFD, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},
				[]byte{0x03, 0xE8, 0x07, 0xD0})},
		{"v4-mapped pair is IPv4", "[::ffff:10.0.0.1]:1", "[::ffff:10.0.0.2]:2", nil,
			cat(sig, []byte{0x21, 0x11, 0x00, 0x0C, 10, 0, 0, 1, 10, 0, 0, 2, 0, 1, 0, 2})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("keep")
			got, err := AppendProxyV2(prefix, netip.MustParseAddrPort(tt.src), netip.MustParseAddrPort(tt.dst), tt.tlvs...)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(got, []byte("keep")) {
				t.Fatalf("prefix lost: % X", got)
			}
			if got = got[4:]; !bytes.Equal(got, tt.want) {
				t.Fatalf("header\n got % X\nwant % X", got, tt.want)
			}
		})
	}
}

func TestAppendProxyV2Errors(t *testing.T) {
	ok := netip.MustParseAddrPort("10.0.0.1:1")
	for name, f := range map[string]func() ([]byte, error){
		"invalid source": func() ([]byte, error) { return AppendProxyV2(nil, netip.AddrPort{}, ok) },
		"TLV too long": func() ([]byte, error) {
			return AppendProxyV2(nil, ok, ok, ProxyV2TLV{0xD0, make([]byte, 0x10000)})
		},
		"header too long": func() ([]byte, error) {
			big := ProxyV2TLV{0xD0, make([]byte, 0xFFF0)}
			return AppendProxyV2(nil, ok, ok, big, big)
		},
	} {
		b, err := f()
		if !errors.Is(err, errProxyHeader) || len(b) != 0 || !strings.HasPrefix(err.Error(), "proxy: ") {
			t.Errorf("%s: %d bytes, err %v; want errProxyHeader and nothing written", name, len(b), err)
		}
	}
}
