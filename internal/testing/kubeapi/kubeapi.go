// Package kubeapi starts a real Kubernetes API server (etcd and kube-apiserver
// built from their Go modules by hack/k8s/build.sh) on loopback for tests,
// benchmarks and the demo: RBAC on, a real ServiceAccount token issuer, client
// certificates made with crypto/x509. It is not a fake client and not a
// cluster: there is no kubelet, scheduler or controller manager, so pods are
// stored but never run, ServiceAccounts are not created on their own and
// deleted namespaces stay Terminating. Callers play kubelet themselves.
package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

// Defaults the API server is started with; Options overrides some of them.
const (
	// DefaultIssuer is the ServiceAccount token issuer (Kubernetes' usual one).
	DefaultIssuer = "https://kubernetes.default.svc.cluster.local"
	// DefaultServiceCIDR is the range ClusterIPs are allocated from.
	DefaultServiceCIDR = "10.96.0.0/16"
	// AudienceIstioCA is the audience of the tokens the CA accepts.
	AudienceIstioCA = "istio-ca"
	// DefaultAudience is what a TokenRequest without audiences gets.
	DefaultAudience = "https://kubernetes.default.svc"
	// APIAudiences is --api-audiences: the audiences a TokenReview without
	// audiences accepts.
	APIAudiences = DefaultAudience + "," + AudienceIstioCA
)

// Options configures Start. The zero value is a usable server.
type Options struct {
	// BinDir is the directory holding etcd and kube-apiserver. Empty means
	// $ZTG_K8S_BIN when set, else the directory hack/k8s/build.sh prints
	// (building once per process when the cache is empty; ~12 min cold).
	BinDir string
	// Issuer is --service-account-issuer; empty means DefaultIssuer.
	Issuer string
	// ServiceCIDR is --service-cluster-ip-range; empty means DefaultServiceCIDR.
	ServiceCIDR string
	// ExtraAPIServerFlags are appended to kube-apiserver's command line
	// (a later flag overrides an earlier one), e.g. "--feature-gates=...".
	ExtraAPIServerFlags []string
	// Verbose logs every line etcd and kube-apiserver print through
	// the TB's Logf. Otherwise the output goes to files under its TempDir and the
	// last lines of the API server's are logged only when the caller failed.
	Verbose bool
}

// Server is a running etcd and kube-apiserver. Its methods are safe for
// concurrent use. Everything is stopped and removed by the TB's cleanup.
type Server struct {
	t    testkit.TB
	dir  string
	bin  string
	opts Options

	certs   *certSet
	port    int // kube-apiserver's secure port, the same across Restart
	etcdURL string

	etcd *process

	mu        sync.Mutex
	apiserver *process // nil while stopped
	closed    bool
}

// Start starts etcd and kube-apiserver on free loopback ports and returns
// once /readyz answers (a few seconds). It fails t when anything goes wrong.
// Under `go test -short` it skips t.
func Start(t testkit.TB, opts Options) *Server {
	t.Helper()
	testkit.SkipShort(t, "the Kubernetes binaries (etcd, kube-apiserver)")
	if opts.Issuer == "" {
		opts.Issuer = DefaultIssuer
	}
	if opts.ServiceCIDR == "" {
		opts.ServiceCIDR = DefaultServiceCIDR
	}
	bin := opts.BinDir
	if bin == "" {
		var err error
		if bin, err = binDir(t); err != nil {
			t.Fatalf("kubeapi: %v", err)
		}
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			t.Fatalf("kubeapi: %s missing from %s: %v (build with hack/k8s/build.sh)", b, bin, err)
		}
	}
	s := &Server{t: t, dir: t.TempDir(), bin: bin, opts: opts}
	t.Cleanup(s.close)

	var err error
	if s.certs, err = writeCerts(s.dir); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	ports, err := freePorts(3)
	if err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	s.port = ports[2]
	if err := s.startEtcd(ports[0], ports[1]); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	if err := s.writeKubeconfig(); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	if err := s.startAPIServer(); err != nil {
		t.Fatalf("kubeapi: %v", err)
	}
	return s
}

// Host is the API server's URL, https://127.0.0.1:<port>.
func (s *Server) Host() string { return "https://127.0.0.1:" + strconv.Itoa(s.port) }

// CAFile is the path of the PEM CA that signed the serving certificate, the
// client certificates and nothing else.
func (s *Server) CAFile() string { return s.certs.caFile }

// CAPEM is the content of CAFile.
func (s *Server) CAPEM() []byte { return append([]byte(nil), s.certs.caPEM...) }

// Kubeconfig is the path of a kubeconfig for the admin user (system:masters).
// It stays valid across Restart.
func (s *Server) Kubeconfig() string { return filepath.Join(s.dir, "kubeconfig") }

// Config returns a new admin *rest.Config (client certificate in
// system:masters); callers may change it freely.
func (s *Server) Config() *rest.Config {
	return &rest.Config{
		Host: s.Host(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   s.CAPEM(),
			CertData: append([]byte(nil), s.certs.adminCertPEM...),
			KeyData:  append([]byte(nil), s.certs.adminKeyPEM...),
		},
		QPS:   200,
		Burst: 400,
	}
}

// TokenConfig returns a *rest.Config that authenticates with a bearer token
// (a ServiceAccount token from CreateServiceAccountToken) and trusts the CA.
func (s *Server) TokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            s.Host(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.CAPEM()},
	}
}

// Client returns an admin clientset.
func (s *Server) Client() kubernetes.Interface {
	c, err := kubernetes.NewForConfig(s.Config())
	if err != nil {
		s.t.Fatalf("kubeapi: clientset: %v", err)
	}
	return c
}

// Dynamic returns an admin dynamic client.
func (s *Server) Dynamic() dynamic.Interface {
	c, err := dynamic.NewForConfig(s.Config())
	if err != nil {
		s.t.Fatalf("kubeapi: dynamic client: %v", err)
	}
	return c
}

// Stop stops kube-apiserver (etcd keeps the data), so clients see connection
// refused until Restart. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.apiserver
	s.apiserver = nil
	s.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// Restart stops kube-apiserver if it runs, starts it again on the same port
// with the same certificates and keys (tokens issued before stay valid), and
// waits for /readyz.
func (s *Server) Restart() error {
	s.Stop()
	return s.startAPIServer()
}

// close stops everything; it is the TB cleanup.
func (s *Server) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	p := s.apiserver
	s.apiserver = nil
	s.mu.Unlock()
	if s.t.Failed() && !s.opts.Verbose {
		s.logTail("kube-apiserver.log", 40)
	}
	if p != nil {
		p.stop()
	}
	if s.etcd != nil {
		s.etcd.stop()
	}
}

func (s *Server) logTail(name string, n int) {
	b, err := os.ReadFile(filepath.Join(s.dir, name))
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	s.t.Logf("kubeapi: last lines of %s:\n%s", name, strings.Join(lines, "\n"))
}

func (s *Server) startEtcd(clientPort, peerPort int) error {
	client := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	args := []string{
		"--name=kubeapi",
		"--data-dir=" + filepath.Join(s.dir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kubeapi=" + peer,
		"--unsafe-no-fsync",
		"--log-level=warn",
	}
	p, err := s.spawn("etcd", args)
	if err != nil {
		return err
	}
	s.etcd = p
	s.etcdURL = client
	return waitHTTP(p, 30*time.Second, http.DefaultClient, client+"/health")
}

func (s *Server) startAPIServer() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("kubeapi: server closed")
	}
	if s.apiserver != nil {
		s.mu.Unlock()
		return errors.New("kubeapi: kube-apiserver already running")
	}
	s.mu.Unlock()

	c := s.certs
	args := []string{
		"--etcd-servers=" + s.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.port),
		// A loopback advertise address is refused by the endpoint reconciler.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(s.dir, "apiserver-certs"),
		"--tls-cert-file=" + c.servingCertFile,
		"--tls-private-key-file=" + c.servingKeyFile,
		"--client-ca-file=" + c.caFile,
		"--service-account-issuer=" + s.opts.Issuer,
		"--service-account-key-file=" + c.saPubFile,
		"--service-account-signing-key-file=" + c.saKeyFile,
		"--api-audiences=" + APIAudiences,
		"--service-cluster-ip-range=" + s.opts.ServiceCIDR,
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		// No controller manager creates default ServiceAccounts.
		"--disable-admission-plugins=ServiceAccount",
		"--profiling=false",
	}
	args = append(args, s.opts.ExtraAPIServerFlags...)
	p, err := s.spawn("kube-apiserver", args)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(c.adminCertPEM, c.adminKeyPEM)
	if err != nil {
		p.stop()
		return fmt.Errorf("kubeapi: admin key pair: %w", err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs:      c.pool,
		Certificates: []tls.Certificate{cert},
	}}}
	defer hc.CloseIdleConnections()
	if err := waitHTTP(p, 60*time.Second, hc, s.Host()+"/readyz"); err != nil {
		p.stop()
		s.logTail("kube-apiserver.log", 40)
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		p.stop()
		return errors.New("kubeapi: server closed")
	}
	s.apiserver = p
	return nil
}

func (s *Server) writeKubeconfig() error {
	c := s.certs
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubeapi
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: kubeapi
  context:
    cluster: kubeapi
    user: admin
current-context: kubeapi
`, s.Host(), c.caFile, c.adminCertFile, c.adminKeyFile)
	if err := os.WriteFile(s.Kubeconfig(), []byte(kc), 0o600); err != nil {
		return fmt.Errorf("kubeapi: write kubeconfig: %w", err)
	}
	return nil
}

// process is one child process with its output in a log file.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

func (s *Server) spawn(name string, args []string) (*process, error) {
	logf, err := os.OpenFile(filepath.Join(s.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %s log: %w", name, err)
	}
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.opts.Verbose {
		w := io.MultiWriter(logf, &lineLogger{t: s.t, prefix: name + ": "})
		cmd.Stdout, cmd.Stderr = w, w
	} else {
		cmd.Stdout, cmd.Stderr = logf, logf
	}
	// Its own process group, and killed if the test binary dies first.
	// Pdeathsig fires when the *thread* that started the child exits, and Go
	// may end threads (a goroutine exiting while locked, as a failed netns
	// switch does), so the child is started and waited for on a locked
	// thread of its own that lives exactly as long as the child.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		err := cmd.Start()
		started <- err
		if err != nil {
			return
		}
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("kubeapi: start %s: %w", name, err)
	}
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after 10 s, and waits for the exit.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitHTTP polls url until it answers 200, p exits, or timeout passes.
func waitHTTP(p *process, timeout time.Duration, hc *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("kubeapi: %s exited before %s was ready: %v", p.name, url, p.err)
		case <-ctx.Done():
			return fmt.Errorf("kubeapi: %s: %s not ready after %v (last: %s)", p.name, url, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct free loopback TCP ports. Another process may
// take one before it is used; Start then fails clearly rather than flakily.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// lineLogger passes whole lines to the TB's Logf. exec.Cmd writes to it from one
// goroutine per stream; mu keeps the two streams from interleaving.
type lineLogger struct {
	t      testkit.TB
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (l *lineLogger) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.t.Logf("%s%s", l.prefix, l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}
