// Package benchkit holds what several benchmark programs under bench/ share
// when they run a proxy as a child process and compare it with a peer:
// the process's CPU time and memory from /proc, HAProxy started in the
// foreground, the PEM file HAProxy reads a certificate from, and the
// percentiles the figures are made of. It measures nothing by itself.
package benchkit

import (
	"bufio"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// CPU is a process's user + system CPU time (all its threads) so far, from
// /proc/<pid>/stat.
func CPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may hold spaces, in
	// parentheses) start with the state, field 3; utime is 14, stime 15.
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat %q", pid, s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad /proc/%d/stat %q", pid, s)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// Status returns the numeric fields of /proc/<pid>/status (kB for the
// memory fields: VmRSS, VmHWM, RssAnon, ...).
func Status(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.Fields(v + " x")[0], 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, sc.Err()
}

// CertKeyPEM is HAProxy's crt file: the certificate chain, then the key.
func CertKeyPEM(wc *identity.WorkloadCertificate) ([]byte, error) {
	var b strings.Builder
	for _, der := range wc.TLS.Certificate {
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	key, err := x509.MarshalPKCS8PrivateKey(wc.TLS.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("encoding the %s key: %w", wc.Identity, err)
	}
	b.Write(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}))
	return []byte(b.String()), nil
}

// StartHAProxy runs `bin -db -f cfg` (foreground, one process) as a child
// tracked by r (nil: untracked; it still gets SIGKILL if this process dies)
// and waits until every addr accepts connections. stop kills and reaps it.
func StartHAProxy(r *Reaper, bin, cfg string, addrs []string) (pid int, stop func(), err error) {
	cmd := exec.Command(bin, "-db", "-f", cfg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	r.Track(cmd.Process)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		cmd.Process.Kill()
		<-exited
		r.Untrack(cmd.Process)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range addrs {
		for {
			conn, err := net.DialTimeout("tcp", a, time.Second)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case werr := <-exited:
				exited <- werr // for stop
				stop()
				return 0, nil, fmt.Errorf("exited before listening on %s: %v", a, werr)
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				stop()
				return 0, nil, fmt.Errorf("not listening on %s after 10 s: %w", a, err)
			}
		}
	}
	return cmd.Process.Pid, stop, nil
}

// Percentile is the p-th percentile of sorted (nearest rank).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Median is the median of v (NaN for none), v left as it is.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WriteCA writes c's root certificate and key to dir for LoadCA (a child
// process issues its own certificates from the same root).
func WriteCA(c *ca.CA, dir string) error {
	key, err := c.RootKeyPEM()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "root.pem"), c.RootPEM(), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "root-key.pem"), key, 0o600)
}

// LoadCA reads the CA root that WriteCA wrote to dir.
func LoadCA(dir string) (*ca.CA, error) {
	rootCert, err := os.ReadFile(filepath.Join(dir, "root.pem"))
	if err != nil {
		return nil, err
	}
	rootKey, err := os.ReadFile(filepath.Join(dir, "root-key.pem"))
	if err != nil {
		return nil, err
	}
	return ca.New(ca.Options{RootCertPEM: rootCert, RootKeyPEM: rootKey})
}

// WithHeapProfile returns the GODEBUG value godebug with the heap
// profile's sampling on at Go's default rate, unless it sets
// memprofilerate already: the node proxy and the waypoint turn it off
// (daemon.HeapProfileOff), and a benchmark asked for heap profiles turns
// it back on for them.
func WithHeapProfile(godebug string) string {
	if daemon.GodebugSets(godebug, "memprofilerate") {
		return godebug
	}
	if godebug == "" {
		return "memprofilerate=524288"
	}
	return godebug + ",memprofilerate=524288"
}
