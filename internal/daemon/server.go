package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Exposure says who may reach a server.
type Exposure int

const (
	// Debug servers (config dumps, /logging, pprof, shutdown) bind loopback
	// only: Listen refuses any other address. Reach them from outside
	// with kubectl port-forward, which connects to the pod's loopback.
	Debug Exposure = iota
	// Public servers carry only what is safe to show the network
	// (readiness, metrics) and may bind any address, the pod IP included.
	Public
)

// ShutdownGrace bounds how long Serve waits for in-flight requests once its
// context is done.
const ShutdownGrace = 5 * time.Second

// Spec is one HTTP server.
type Spec struct {
	// Name tells the servers apart in logs, errors and Servers.Addrs
	// ("admin", "metrics", "readiness").
	Name string
	// Addr is host:port; "" disables the server. "localhost" binds
	// 127.0.0.1 and, when the host has it, ::1 (on the same port). "[::]"
	// binds all addresses, falling back to 0.0.0.0 without IPv6. Any other
	// host must be an IP.
	Addr string
	// Exposure Debug (the zero value) binds loopback only.
	Exposure Exposure
	// Handler serves the requests. Required.
	Handler http.Handler
	// TLS, when set, serves HTTPS only (a plaintext request is refused by
	// the handshake); nil serves plain HTTP.
	TLS *tls.Config
}

// Servers are bound HTTP servers. Create with Listen, then Serve (or Close).
type Servers struct {
	log      *zap.Logger
	servers  []*http.Server
	bindings []binding
	addrs    map[string][]net.Addr
}

type binding struct {
	name string
	hs   *http.Server
	l    net.Listener
}

// Listen binds every server of specs with an address. It fails, with
// nothing left bound, on a conflict, an unparsable address, or a Debug
// server on a non-loopback address. log may be nil.
func Listen(log *zap.Logger, specs ...Spec) (_ *Servers, err error) {
	if log == nil {
		log = zap.NewNop()
	}
	s := &Servers{log: log, addrs: map[string][]net.Addr{}}
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	for _, sp := range specs {
		if sp.Addr == "" {
			continue
		}
		if sp.Handler == nil {
			return nil, fmt.Errorf("daemon: %s server: no handler", sp.Name)
		}
		ls, err := listen(sp.Addr, sp.Exposure == Debug)
		if err != nil {
			return nil, fmt.Errorf("%s server: %w", sp.Name, err)
		}
		hs := &http.Server{
			Handler:           sp.Handler,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          zap.NewStdLog(log.Named(sp.Name)),
		}
		s.servers = append(s.servers, hs)
		for _, l := range ls {
			if sp.TLS != nil {
				l = tls.NewListener(l, sp.TLS)
			}
			s.bindings = append(s.bindings, binding{sp.Name, hs, l})
			s.addrs[sp.Name] = append(s.addrs[sp.Name], l.Addr())
		}
	}
	return s, nil
}

// Addrs returns the bound addresses of the named server (useful with port
// 0); none when it is disabled.
func (s *Servers) Addrs(name string) []net.Addr { return s.addrs[name] }

// Serve serves until ctx is done, then shuts the servers down, waiting up to
// ShutdownGrace for in-flight requests, and returns nil. A listener that
// fails while serving is logged; the others keep serving.
func (s *Servers) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, b := range s.bindings {
		s.log.Info("serving", zap.String("server", b.name), zap.Stringer("addr", b.l.Addr()))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.hs.Serve(b.l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("http listener failed", zap.Stringer("addr", b.l.Addr()), zap.Error(err))
			}
		}()
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	for _, hs := range s.servers {
		_ = hs.Shutdown(sctx)
	}
	wg.Wait()
	return nil
}

// Close closes every listener and server at once (when Serve was never
// called, or to abort).
func (s *Servers) Close() error {
	errs := []error{s.closeListeners()}
	for _, hs := range s.servers {
		errs = append(errs, hs.Close())
	}
	return errors.Join(errs...)
}

func (s *Servers) closeListeners() error {
	var errs []error
	for _, b := range s.bindings {
		if err := b.l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ValidateAddr checks addr as Listen would (without binding): host:port
// with an IP or "localhost" host, and a loopback host when debug.
func ValidateAddr(addr string, debug bool) error {
	_, _, _, err := parseAddr(addr, debug)
	return err
}

// parseAddr splits addr; localhost reports host "localhost".
func parseAddr(addr string, loopback bool) (host, port string, ip netip.Addr, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", ip, fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "localhost" {
		return host, port, ip, nil
	}
	if host != "" {
		if ip, err = netip.ParseAddr(host); err != nil {
			return "", "", ip, fmt.Errorf("address %q: host must be an IP or localhost", addr)
		}
	}
	if loopback && (host == "" || !ip.IsLoopback()) {
		return "", "", ip, fmt.Errorf("address %q: debug endpoints bind loopback only (localhost, 127.0.0.1 or [::1]); "+
			"reach them with kubectl port-forward", addr)
	}
	return host, port, ip, nil
}

// listen binds addr (see Spec.Addr).
func listen(addr string, loopback bool) ([]net.Listener, error) {
	host, port, ip, err := parseAddr(addr, loopback)
	if err != nil {
		return nil, err
	}
	if host == "localhost" {
		l4, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			return nil, err
		}
		ls := []net.Listener{l4}
		p := port
		if p == "0" { // bind ::1 on the same port as 127.0.0.1
			p = fmt.Sprint(l4.Addr().(*net.TCPAddr).Port)
		}
		if l6, err := net.Listen("tcp6", net.JoinHostPort("::1", p)); err == nil {
			ls = append(ls, l6)
		}
		return ls, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil && ip == netip.IPv6Unspecified() {
		l, err = net.Listen("tcp4", net.JoinHostPort("0.0.0.0", port))
	}
	if err != nil {
		return nil, err
	}
	return []net.Listener{l}, nil
}
