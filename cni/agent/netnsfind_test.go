package agent

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/netnstest"
	"github.com/ztunnel-go/ztunnel-go/internal/testing/roottest"
)

const podUID = "3f9a2c1e-7b4d-4e2a-9c1f-0a1b2c3d4e5f"

func TestCgroupNamesPod(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup string
		want         bool
	}{
		{"systemd v2", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3f9a2c1e_7b4d_4e2a_9c1f_0a1b2c3d4e5f.slice/cri-containerd-abc.scope\n", true},
		{"systemd guaranteed", "0::/kubepods.slice/kubepods-pod3f9a2c1e_7b4d_4e2a_9c1f_0a1b2c3d4e5f.slice/cri-containerd-abc.scope\n", true},
		{"cgroupfs v1 among others", "12:pids:/\n4:memory:/kubepods/besteffort/pod3f9a2c1e-7b4d-4e2a-9c1f-0a1b2c3d4e5f/abc\n0::/\n", true},
		{"another pod", "0::/kubepods/besteffort/pod3f9a2c1e-7b4d-4e2a-9c1f-0a1b2c3d4e50/abc\n", false},
		{"uid as a longer name's suffix", "0::/kubepods.slice/xpod3f9a2c1e_7b4d_4e2a_9c1f_0a1b2c3d4e5f.slice\n", false},
		{"uid in a container name only", "0::/system.slice/pod3f9a2c1e-7b4d-4e2a-9c1f-0a1b2c3d4e5f.scope\n", false},
		{"not a pod", "0::/user.slice/session-1.scope\n", false},
		{"malformed", "garbage\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cgroupNamesPod([]byte(tc.cgroup), podUID); got != tc.want {
				t.Errorf("cgroupNamesPod(%q) = %v, want %v", tc.cgroup, got, tc.want)
			}
		})
	}
}

// fakeProc is a proc root whose PID entries point at real namespaces.
type fakeProc struct {
	t    *testing.T
	root string
}

func (p fakeProc) add(pid int, cgroup string, ns *netnstest.NS) {
	dir := filepath.Join(p.root, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
		p.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Symlink("/var/run/netns/"+ns.Name, filepath.Join(dir, "ns", "net")); err != nil {
		p.t.Fatal(err)
	}
}

// TestFindPodNetns: the pod's namespace is the one of its cgroup's
// processes (or the CNI ADD's sandbox path), confirmed by its IPs; a
// namespace that merely holds the IPs is never chosen.
func TestFindPodNetns(t *testing.T) {
	roottest.Require(t)
	victim := netnstest.New(t, "victim")
	attacker := netnstest.New(t, "attacker")
	netnstest.Veth(t, victim, "va", []string{"10.77.0.1/24"}, attacker, "vb", []string{"10.77.0.2/24", "10.77.0.1/32"})
	self, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	ip := []netip.Addr{netip.MustParseAddr("10.77.0.1")}
	systemd := "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod3f9a2c1e_7b4d_4e2a_9c1f_0a1b2c3d4e5f.slice/cri-containerd-1.scope\n"
	other := "0::/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/c\n"

	for _, tc := range []struct {
		name  string
		procs func(p fakeProc)
		ips   []netip.Addr
		hint  string
		want  *netnstest.NS
	}{
		{name: "by cgroup, confirmed by IP", ips: ip, want: victim, procs: func(p fakeProc) {
			p.add(10, other, attacker) // first in the scan, holds the IP too
			p.add(20, systemd, victim)
			p.add(21, systemd, victim)
		}},
		{name: "no process of the pod: the IP holder is not taken", ips: ip, procs: func(p fakeProc) {
			p.add(10, other, attacker)
		}},
		{name: "cgroup's namespace lacks the pod IP", ips: []netip.Addr{netip.MustParseAddr("10.77.0.9")}, procs: func(p fakeProc) {
			p.add(20, systemd, victim)
		}},
		{name: "the pod's processes disagree", ips: ip, procs: func(p fakeProc) {
			p.add(20, systemd, victim)
			p.add(21, systemd, attacker)
		}},
		{name: "hint from the CNI ADD", ips: ip, hint: "/var/run/netns/" + victim.Name, want: victim, procs: func(fakeProc) {}},
		{name: "hint lacking the IP falls back to the cgroup", ips: []netip.Addr{netip.MustParseAddr("10.77.0.2")},
			hint: "/var/run/netns/" + victim.Name, want: attacker, procs: func(p fakeProc) {
				p.add(20, systemd, attacker)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fakeProc{t: t, root: t.TempDir()}
			tc.procs(p)
			path, h, err := FindPodNetns(context.Background(), NetnsQuery{UID: podUID, IPs: tc.ips, Hint: tc.hint, Self: self.ID(), ProcRoot: p.root})
			if tc.want == nil {
				if !errors.Is(err, ErrNetnsUnproven) {
					t.Fatalf("FindPodNetns = %q, %v; want ErrNetnsUnproven", path, err)
				}
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			if h.ID() != tc.want.ID() {
				t.Fatalf("FindPodNetns found %s (%s), want %s", path, h.ID(), tc.want.Name)
			}
		})
	}
	t.Run("the node's own namespace is never a pod's", func(t *testing.T) {
		p := fakeProc{t: t, root: t.TempDir()}
		p.add(20, systemd, victim)
		_, _, err := FindPodNetns(context.Background(), NetnsQuery{UID: podUID, Self: victim.ID(), ProcRoot: p.root,
			Hint: "/var/run/netns/" + victim.Name})
		if !errors.Is(err, ErrNetnsUnproven) {
			t.Fatalf("err = %v, want ErrNetnsUnproven", err)
		}
	})
}
