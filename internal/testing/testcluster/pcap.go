package testcluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Packet is one captured Ethernet frame, decoded as far as IPv4 TCP/UDP.
type Packet struct {
	Time      time.Time
	Len       int    // original frame length
	EtherType uint16 // 0x0800 IPv4, 0x0806 ARP, ...
	// Proto is "tcp", "udp", "icmp", "ipv4" (another IP protocol), "arp" or
	// "other".
	Proto string
	// Src and Dst carry the IPv4 addresses, with ports for TCP and UDP.
	Src, Dst netip.AddrPort
	TCPFlags uint8 // TCP only: FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10
	// TCPSeq is the TCP sequence number (TCP only): a retransmitted segment
	// repeats it, so a reader reassembling a stream can drop repeats.
	TCPSeq  uint32
	Payload []byte // the TCP/UDP payload as captured
}

// TCP flag bits.
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPPsh = 0x08
	TCPAck = 0x10
)

// ErrPcap is returned (wrapped) for a malformed capture file.
var ErrPcap = errors.New("malformed pcap")

// ParsePcap decodes a classic pcap stream (what `tcpdump -w` writes) with
// Ethernet link type, in either byte order, micro- or nanosecond stamps. A
// record cut short at the end (the writer was killed mid-packet) ends the
// stream without error.
func ParsePcap(data []byte) ([]Packet, error) {
	if len(data) < 24 {
		return nil, fmt.Errorf("%w: %d-byte header", ErrPcap, len(data))
	}
	var bo binary.ByteOrder
	var nano bool
	switch binary.LittleEndian.Uint32(data) {
	case 0xa1b2c3d4:
		bo = binary.LittleEndian
	case 0xa1b23c4d:
		bo, nano = binary.LittleEndian, true
	case 0xd4c3b2a1:
		bo = binary.BigEndian
	case 0x4d3cb2a1:
		bo, nano = binary.BigEndian, true
	default:
		return nil, fmt.Errorf("%w: magic %#x", ErrPcap, binary.LittleEndian.Uint32(data))
	}
	if lt := bo.Uint32(data[20:]) & 0x0fffffff; lt != 1 {
		return nil, fmt.Errorf("%w: link type %d, want 1 (Ethernet)", ErrPcap, lt)
	}
	var out []Packet
	for off := 24; off+16 <= len(data); {
		sec, frac := bo.Uint32(data[off:]), bo.Uint32(data[off+4:])
		incl, orig := int(bo.Uint32(data[off+8:])), int(bo.Uint32(data[off+12:]))
		off += 16
		if incl > len(data)-off {
			break // truncated last record
		}
		if !nano {
			frac *= 1000
		}
		p := decodeEthernet(data[off : off+incl])
		p.Time = time.Unix(int64(sec), int64(frac))
		p.Len = orig
		out = append(out, p)
		off += incl
	}
	return out, nil
}

func decodeEthernet(f []byte) Packet {
	p := Packet{Proto: "other"}
	if len(f) < 14 {
		return p
	}
	p.EtherType = binary.BigEndian.Uint16(f[12:])
	l3 := f[14:]
	if p.EtherType == 0x8100 && len(f) >= 18 { // one VLAN tag
		p.EtherType = binary.BigEndian.Uint16(f[16:])
		l3 = f[18:]
	}
	switch p.EtherType {
	case 0x0806:
		p.Proto = "arp"
	case 0x0800:
		decodeIPv4(l3, &p)
	}
	return p
}

func decodeIPv4(b []byte, p *Packet) {
	if len(b) < 20 || b[0]>>4 != 4 {
		return
	}
	ihl := int(b[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(b[2:]))
	if ihl < 20 || len(b) < ihl {
		return
	}
	if total >= ihl && total < len(b) {
		b = b[:total] // drop Ethernet padding
	}
	src := netip.AddrFrom4([4]byte(b[12:16]))
	dst := netip.AddrFrom4([4]byte(b[16:20]))
	p.Src, p.Dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
	p.Proto = "ipv4"
	fragOff := binary.BigEndian.Uint16(b[6:]) & 0x1fff
	l4 := b[ihl:]
	switch b[9] {
	case 1:
		p.Proto = "icmp"
	case 6:
		p.Proto = "tcp"
		if fragOff != 0 || len(l4) < 20 {
			return
		}
		p.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:]))
		p.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
		p.TCPFlags = l4[13]
		p.TCPSeq = binary.BigEndian.Uint32(l4[4:])
		if doff := int(l4[12]>>4) * 4; doff >= 20 && doff <= len(l4) {
			p.Payload = l4[doff:]
		}
	case 17:
		p.Proto = "udp"
		if fragOff != 0 || len(l4) < 8 {
			return
		}
		p.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:]))
		p.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
		p.Payload = l4[8:]
	}
}
