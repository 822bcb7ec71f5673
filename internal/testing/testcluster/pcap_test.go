package testcluster

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// frame builds an Ethernet/IPv4 frame with a TCP or UDP header and payload.
func frame(proto byte, src, dst netip.AddrPort, flags byte, payload string, pad int) []byte {
	l4len := 8
	if proto == 6 {
		l4len = 20
	}
	ip := make([]byte, 20+l4len+len(payload))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	ip[8], ip[9] = 64, proto
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	l4 := ip[20:]
	binary.BigEndian.PutUint16(l4[0:], src.Port())
	binary.BigEndian.PutUint16(l4[2:], dst.Port())
	if proto == 6 {
		l4[12] = 5 << 4
		l4[13] = flags
	}
	copy(l4[l4len:], payload)
	eth := make([]byte, 14, 14+len(ip)+pad)
	eth[12], eth[13] = 0x08, 0x00
	return append(append(eth, ip...), make([]byte, pad)...)
}

func pcapFile(bo binary.ByteOrder, nano bool, frames ...[]byte) []byte {
	h := make([]byte, 24)
	magic := uint32(0xa1b2c3d4)
	if nano {
		magic = 0xa1b23c4d
	}
	bo.PutUint32(h[0:], magic)
	bo.PutUint16(h[4:], 2)
	bo.PutUint16(h[6:], 4)
	bo.PutUint32(h[16:], 262144)
	bo.PutUint32(h[20:], 1)
	for i, f := range frames {
		r := make([]byte, 16)
		bo.PutUint32(r[0:], 1700000000)
		bo.PutUint32(r[4:], uint32(i))
		bo.PutUint32(r[8:], uint32(len(f)))
		bo.PutUint32(r[12:], uint32(len(f)))
		h = append(append(h, r...), f...)
	}
	return h
}

func TestParsePcap(t *testing.T) {
	a, b := netip.MustParseAddrPort("10.31.0.10:40000"), netip.MustParseAddrPort("10.31.1.10:15008")
	tcp := frame(6, a, b, TCPSyn|TCPAck, "hello", 0)
	udp := frame(17, b, a, 0, "dns", 20) // with Ethernet padding, which is not payload
	arp := append(make([]byte, 12), 0x08, 0x06, 0, 1)
	for _, tc := range []struct {
		name string
		bo   binary.ByteOrder
		nano bool
	}{{"little endian µs", binary.LittleEndian, false}, {"big endian ns", binary.BigEndian, true}} {
		t.Run(tc.name, func(t *testing.T) {
			data := pcapFile(tc.bo, tc.nano, tcp, udp, arp)
			pkts, err := ParsePcap(append(data, 1, 2, 3)) // plus a cut-off record
			if err != nil {
				t.Fatal(err)
			}
			if len(pkts) != 3 {
				t.Fatalf("got %d packets, want 3", len(pkts))
			}
			if p := pkts[0]; p.Proto != "tcp" || p.Src != a || p.Dst != b || p.TCPFlags != TCPSyn|TCPAck || string(p.Payload) != "hello" || p.Len != len(tcp) {
				t.Errorf("tcp packet = %+v", p)
			}
			if p := pkts[1]; p.Proto != "udp" || p.Src != b || p.Dst != a || string(p.Payload) != "dns" {
				t.Errorf("udp packet = %+v (payload %q)", p, p.Payload)
			}
			if p := pkts[2]; p.Proto != "arp" || p.EtherType != 0x0806 {
				t.Errorf("arp packet = %+v", p)
			}
			wantNS := 1
			if !tc.nano {
				wantNS = 1000
			}
			if pkts[1].Time.Unix() != 1700000000 || pkts[1].Time.Nanosecond() != wantNS {
				t.Errorf("timestamp = %v", pkts[1].Time)
			}
		})
	}
	for _, bad := range [][]byte{nil, make([]byte, 24), pcapFile(binary.LittleEndian, false)[:23]} {
		if _, err := ParsePcap(bad); !errors.Is(err, ErrPcap) {
			t.Errorf("ParsePcap(%d bytes) = %v, want ErrPcap", len(bad), err)
		}
	}
	raw := pcapFile(binary.LittleEndian, false)
	binary.LittleEndian.PutUint32(raw[20:], 101) // LINKTYPE_RAW
	if _, err := ParsePcap(raw); !errors.Is(err, ErrPcap) {
		t.Errorf("non-Ethernet link type: %v, want ErrPcap", err)
	}
}

// FuzzParsePcap: never panic, never return payloads outside the input.
func FuzzParsePcap(f *testing.F) {
	a, b := netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:2")
	f.Add(pcapFile(binary.LittleEndian, false, frame(6, a, b, TCPSyn, "x", 0)))
	f.Add(pcapFile(binary.BigEndian, true, frame(17, a, b, 0, "yy", 30)))
	f.Add(pcapFile(binary.LittleEndian, false, []byte{1, 2, 3}))
	f.Fuzz(func(t *testing.T, data []byte) {
		pkts, err := ParsePcap(data)
		if err != nil {
			return
		}
		for _, p := range pkts {
			if len(p.Payload) > len(data) {
				t.Fatalf("payload of %d bytes from %d input bytes", len(p.Payload), len(data))
			}
		}
	})
}

func TestDroppedByKernel(t *testing.T) {
	stderr := "tcpdump: listening on br0\n12 packets captured\n14 packets received by filter\n2 packets dropped by kernel\n"
	if n := droppedByKernel(stderr); n != 2 {
		t.Fatalf("droppedByKernel = %d, want 2", n)
	}
	if n := droppedByKernel("tcpdump: listening on br0\n0 packets dropped by kernel\n"); n != 0 {
		t.Fatalf("droppedByKernel = %d, want 0", n)
	}
}
