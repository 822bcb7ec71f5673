package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// markerEtherType is the IEEE "local experimental" EtherType of the frame
// Capture.Stop sends to know the capture has caught up.
const markerEtherType = 0x88b5

// Capture is a running tcpdump on a bridge (the underlay's br0, or one of
// an extra namespace, see CaptureBridge).
type Capture struct {
	c       *Cluster
	ns      *NetNS // where the bridge is
	iface   string // the bridge the marker frame goes onto
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error

	mu     sync.Mutex
	buf    bytes.Buffer
	stderr bytes.Buffer
	grew   chan struct{} // closed and replaced whenever buf grows
}

// CaptureUnderlay starts tcpdump on the underlay bridge br0 (every packet
// between nodes crosses it) with a pcap filter expression ("" captures
// everything), and returns once tcpdump is capturing. Capture.Stop returns
// the packets. Needs tcpdump (`make deps`).
func (c *Cluster) CaptureUnderlay(ctx context.Context, filter string) (*Capture, error) {
	return c.underlay.CaptureBridge(ctx, "br0", filter)
}

// CaptureBridge is CaptureUnderlay for bridge iface of namespace ns (an
// extra namespace of the cluster joining it to something else, say). The
// bridge must carry every packet of interest: Stop proves the capture
// complete with a frame broadcast on it.
func (ns *NetNS) CaptureBridge(ctx context.Context, iface, filter string) (*Capture, error) {
	c := ns.c
	tcpdump, err := exec.LookPath("tcpdump")
	if err != nil {
		return nil, fmt.Errorf("testcluster: tcpdump not found (`make deps`): %w", err)
	}
	args := []string{"netns", "exec", ns.name, tcpdump,
		"-i", iface, "-n", "-U", "--immediate-mode", "-B", "131072", "-Z", "root", "-w", "-"}
	if filter != "" {
		args = append(args, fmt.Sprintf("(%s) or ether proto %#x", filter, markerEtherType))
	}
	cp := &Capture{c: c, ns: ns, iface: iface, done: make(chan struct{}), grew: make(chan struct{})}
	cp.cmd = exec.Command(c.ipPath, args...)
	cp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cp.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cp.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cp.cmd.Start(); err != nil {
		return nil, fmt.Errorf("testcluster: start tcpdump: %w", err)
	}
	c.mu.Lock()
	c.captures = append(c.captures, cp)
	c.mu.Unlock()

	listening := make(chan struct{})
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() {
		defer pipes.Done()
		sc := bufio.NewScanner(stderr)
		seen := false
		for sc.Scan() {
			cp.mu.Lock()
			cp.stderr.WriteString(sc.Text() + "\n")
			cp.mu.Unlock()
			if !seen && strings.Contains(sc.Text(), "listening on") {
				seen = true
				close(listening)
			}
		}
	}()
	go func() {
		defer pipes.Done()
		b := make([]byte, 64<<10)
		for {
			n, err := stdout.Read(b)
			if n > 0 {
				cp.mu.Lock()
				cp.buf.Write(b[:n])
				close(cp.grew)
				cp.grew = make(chan struct{})
				cp.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		pipes.Wait() // read everything before Wait closes the pipes
		cp.waitErr = cp.cmd.Wait()
		close(cp.done)
	}()

	select {
	case <-listening:
		return cp, nil
	case <-cp.done:
		return nil, fmt.Errorf("testcluster: tcpdump exited (%v): %s", cp.waitErr, cp.stderrText())
	case <-ctx.Done():
		cp.kill()
		return nil, fmt.Errorf("testcluster: waiting for tcpdump: %w", ctx.Err())
	}
}

func (cp *Capture) stderrText() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return strings.TrimSpace(cp.stderr.String())
}

// Stop ends the capture and returns every packet that crossed the bridge
// before the call. To be sure tcpdump has written them all, it first sends a
// marker frame onto the bridge (again every half second) and waits (up to
// 10 s) until the marker shows up in the output; the marker is not returned.
func (cp *Capture) Stop() ([]Packet, error) {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	// One frame can be lost (a busy machine, a full queue): resend the
	// marker every half second until it shows up or 10 s have passed.
	var werr error
	for start := time.Now(); ; {
		if werr = cp.sendMarker(nonce); werr != nil {
			break
		}
		if werr = cp.waitFor(nonce, 500*time.Millisecond); werr == nil || time.Since(start) >= 10*time.Second {
			break
		}
		if errors.Is(werr, errTcpdumpExited) {
			break
		}
	}
	cp.signal(syscall.SIGTERM)
	select {
	case <-cp.done:
	case <-time.After(5 * time.Second):
		cp.kill()
	}
	cp.mu.Lock()
	data := append([]byte(nil), cp.buf.Bytes()...)
	cp.mu.Unlock()
	pkts, err := ParsePcap(data)
	if err != nil {
		return nil, fmt.Errorf("testcluster: capture: %w (tcpdump: %s)", err, cp.stderrText())
	}
	out := pkts[:0]
	for _, p := range pkts {
		if p.EtherType != markerEtherType {
			out = append(out, p)
		}
	}
	if werr != nil {
		return out, fmt.Errorf("testcluster: capture may be incomplete: %w", werr)
	}
	// Resending the marker must not hide a lossy capture: tcpdump reports
	// the kernel's drops when it exits.
	if n := droppedByKernel(cp.stderrText()); n > 0 {
		return out, fmt.Errorf("testcluster: capture incomplete: %d packets dropped by kernel", n)
	}
	return out, nil
}

// droppedByKernel reads tcpdump's exit statistics ("N packets dropped by
// kernel"); 0 when absent.
func droppedByKernel(stderr string) int {
	for _, line := range strings.Split(stderr, "\n") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "%d packets dropped by kernel", &n); err == nil {
			return n
		}
	}
	return 0
}

// errTcpdumpExited: tcpdump ended before the capture was stopped.
var errTcpdumpExited = errors.New("tcpdump exited")

func (cp *Capture) waitFor(nonce []byte, d time.Duration) error {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		cp.mu.Lock()
		found := bytes.Contains(cp.buf.Bytes(), nonce)
		grew := cp.grew
		cp.mu.Unlock()
		if found {
			return nil
		}
		select {
		case <-grew:
		case <-cp.done:
			return fmt.Errorf("%w (%v) before the marker arrived: %s", errTcpdumpExited, cp.waitErr, cp.stderrText())
		case <-deadline.C:
			return fmt.Errorf("marker frame not captured within %v", d)
		}
	}
}

// sendMarker broadcasts one frame of markerEtherType carrying nonce on the
// captured bridge, from inside its namespace.
func (cp *Capture) sendMarker(nonce []byte) error {
	return cp.ns.Do(func() error {
		ifi, err := net.InterfaceByName(cp.iface)
		if err != nil {
			return err
		}
		proto := htons(markerEtherType)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		frame := make([]byte, 60)
		copy(frame[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(frame[6:12], []byte{0x02, 0x7a, 0x74, 0x00, 0x00, 0x01}) // locally administered
		frame[12], frame[13] = markerEtherType>>8, markerEtherType&0xff
		copy(frame[14:], nonce)
		sa := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index, Halen: 6,
			Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
		if err := unix.Sendto(fd, frame, 0, sa); err != nil {
			return fmt.Errorf("send marker: %w", err)
		}
		return nil
	})
}

// htons converts to network byte order, as AF_PACKET protocol fields want.
func htons(v uint16) uint16 {
	return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v))
}

// kill ends tcpdump at once (cleanup, or a failed start).
func (cp *Capture) kill() {
	cp.signal(syscall.SIGKILL)
	<-cp.done
}

// signal signals tcpdump's process group unless tcpdump was already reaped
// (its pid could belong to someone else by then).
func (cp *Capture) signal(sig syscall.Signal) {
	select {
	case <-cp.done:
	default:
		_ = syscall.Kill(-cp.cmd.Process.Pid, sig)
	}
}
