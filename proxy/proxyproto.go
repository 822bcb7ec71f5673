package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// PROXY protocol version 2 (HAProxy's proxy-protocol.txt, section 2.2), the
// header the inbound side writes ahead of the payload to a workload with an
// application tunnel of protocol PROXY (a sandwiched waypoint), so that it
// learns the original client and its verified identity.
const (
	// ProxyV2TLVPeerIdentity is Istio's TLV type carrying the client's
	// SPIFFE identity as text (workload.proto ApplicationTunnel.PROXY; a
	// type the spec leaves unassigned, outside its 0xE0-0xEF custom range).
	ProxyV2TLVPeerIdentity = 0xD0

	proxyV2VersionProxy = 0x21 // version 2 (high nibble), command PROXY (low)
	proxyV2TCP4         = 0x11 // AF_INET (high nibble), STREAM (low)
	proxyV2TCP6         = 0x21 // AF_INET6, STREAM
)

// proxyV2Sig is the 12-byte signature every v2 header starts with.
var proxyV2Sig = [12]byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

// errProxyHeader: the addresses or TLVs cannot be encoded.
var errProxyHeader = errors.New("cannot encode PROXY v2 header")

// ProxyV2TLV is one type-length-value entry of a v2 header.
type ProxyV2TLV struct {
	Type  byte
	Value []byte
}

// AppendProxyV2 appends a PROXY v2 header for a TCP stream from src to dst
// (command PROXY) with tlvs, in order, to b. IPv4 pairs are written as
// AF_INET; a pair with any IPv6 address as AF_INET6, IPv4 addresses then
// v4-mapped (the spec has no mixed family). It fails when an address is
// invalid or the header would exceed the 16-bit length field.
func AppendProxyV2(b []byte, src, dst netip.AddrPort, tlvs ...ProxyV2TLV) ([]byte, error) {
	if !src.Addr().IsValid() || !dst.Addr().IsValid() {
		return b, fmt.Errorf("proxy: %w: invalid address (%s → %s)", errProxyHeader, src, dst)
	}
	sa, da := src.Addr().Unmap(), dst.Addr().Unmap()
	fam, alen := byte(proxyV2TCP4), 12
	if !sa.Is4() || !da.Is4() {
		fam, alen = proxyV2TCP6, 36
	}
	n := alen
	for _, t := range tlvs {
		if len(t.Value) > 0xFFFF {
			return b, fmt.Errorf("proxy: %w: TLV 0x%02X of %d bytes", errProxyHeader, t.Type, len(t.Value))
		}
		n += 3 + len(t.Value)
	}
	if n > 0xFFFF {
		return b, fmt.Errorf("proxy: %w: %d bytes after the fixed part", errProxyHeader, n)
	}
	b = append(b, proxyV2Sig[:]...)
	b = append(b, proxyV2VersionProxy, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	if fam == proxyV2TCP4 {
		s4, d4 := sa.As4(), da.As4()
		b = append(b, s4[:]...)
		b = append(b, d4[:]...)
	} else {
		s16, d16 := sa.As16(), da.As16()
		b = append(b, s16[:]...)
		b = append(b, d16[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	for _, t := range tlvs {
		b = append(b, t.Type)
		b = binary.BigEndian.AppendUint16(b, uint16(len(t.Value)))
		b = append(b, t.Value...)
	}
	return b, nil
}
