package inpod

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/dnsproxy"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
	"github.com/ztunnel-go/ztunnel-go/proxy"
)

// ProxyFactory is the production Factory: a pod's proxy is its
// proxy.WorkloadProxy (15001, 15006, 15008) and, when DNS is set, its
// dnsproxy.Server (15053), both in the pod's network namespace.
type ProxyFactory struct {
	// Proxy are the shared data-path dependencies. Required.
	Proxy *proxy.Deps
	// DNS, when non-nil, starts a DNS server per pod with this template
	// (Workload and Deps.Netns are filled in per pod). nil: no DNS proxy
	// (DNS_PROXY=false).
	DNS *DNSTemplate

	depsOnce sync.Once
	deps     *proxy.Deps
}

// proxyDeps are Proxy with a Resolver for endpoints known by hostname when
// Proxy has none: a dnsproxy.HostResolver over the DNS template's
// forwarder (the upstreams the pods' DNS proxies forward to), else over
// the node proxy's resolv.conf, marked with Config.PacketMark.
func (f *ProxyFactory) proxyDeps() *proxy.Deps {
	f.depsOnce.Do(func() {
		f.deps = f.Proxy
		warn := func(err error) {
			if f.Proxy.Log != nil {
				f.Proxy.Log.Warn("inpod: no resolver for endpoints known by hostname; connections to them will fail",
					zap.Error(err))
			}
		}
		if f.Proxy.Resolver != nil || f.Proxy.Config == nil {
			return
		}
		var fwd *dnsproxy.Forwarder
		if f.DNS != nil {
			fwd = f.DNS.Deps.Forwarder
		}
		if fwd == nil {
			var err error
			fwd, err = dnsproxy.NewForwarder(dnsproxy.ForwarderConfig{Mark: f.Proxy.Config.PacketMark})
			if err != nil {
				warn(err) // hostname endpoints fail (no_healthy_upstream)
				return
			}
		}
		r, err := dnsproxy.NewHostResolver(fwd, f.Proxy.Config.IPv6Enabled)
		if err != nil {
			warn(err)
			return
		}
		d := *f.Proxy
		d.Resolver = r
		f.deps = &d
	})
	return f.deps
}

// DNSTemplate is what every pod's DNS server shares.
type DNSTemplate struct {
	Config dnsproxy.Config
	Deps   dnsproxy.Deps
}

// NewProxy implements Factory.
func (f *ProxyFactory) NewProxy(w Workload, ns *netns.Handle) (Proxy, error) {
	if f.Proxy == nil {
		return nil, errors.New("inpod: ProxyFactory.Proxy is required")
	}
	deps := f.proxyDeps()
	wp, err := proxy.NewWorkloadProxy(deps, proxy.WorkloadInfo{
		UID: w.UID, Name: w.Name, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount,
	}, ns)
	if err != nil {
		return nil, err
	}
	p := &podProxy{wp: wp}
	if f.DNS != nil {
		cfg, deps := f.DNS.Config, f.DNS.Deps
		cfg.Workload = dnsproxy.WorkloadInfo{UID: w.UID, Namespace: w.Namespace, Name: w.Name}
		// Like the other listeners: the next node proxy binds alongside.
		cfg.ReusePort = cfg.ReusePort || (f.Proxy.Config != nil && f.Proxy.Config.InpodPortReuse)
		deps.Netns = ns
		// The DNS proxy's "who is asking" for loopback queries is the
		// workload proxy's own pod lookup (cluster, node, ZDS identity).
		deps.Self = wp.LocalWorkload
		dns, err := dnsproxy.New(cfg, deps)
		if err != nil {
			wp.Close()
			return nil, fmt.Errorf("dns proxy: %w", err)
		}
		p.dns = dns
	}
	return p, nil
}

// podProxy runs a pod's workload proxy and optional DNS server as one
// Proxy.
type podProxy struct {
	wp  *proxy.WorkloadProxy
	dns *dnsproxy.Server // nil without DNS
	// draining: Drain owns the DNS server's end (it drains it after the
	// connections), so Serve must not close it when the listeners go.
	draining atomic.Bool
}

func (p *podProxy) Serve(ctx context.Context) error {
	if p.dns == nil {
		return p.wp.Serve(ctx)
	}
	var (
		wg     sync.WaitGroup
		dnsErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		dnsErr = p.dns.Serve(ctx)
	}()
	err := p.wp.Serve(ctx)
	// The listeners are gone (closed or failed): DNS goes with them, unless
	// they were drained: then Drain drains DNS next and closes it.
	if !p.draining.Load() {
		_ = p.dns.Close()
	}
	wg.Wait()
	return errors.Join(err, dnsErr)
}

// Drain drains the connections; DNS keeps answering until they are done
// (applications often resolve while finishing up), then drains too: it
// finishes the queries it has (a newer node proxy's DNS server, bound
// alongside, takes the new ones) and closes.
func (p *podProxy) Drain(ctx context.Context, deadline time.Duration) {
	p.draining.Store(true)
	p.wp.Drain(ctx, deadline)
	if p.dns != nil {
		p.dns.Drain(ctx, deadline)
	}
}

func (p *podProxy) Close() error {
	p.wp.Close()
	if p.dns != nil {
		return p.dns.Close()
	}
	return nil
}
