// Package jwks fetches the JSON Web Key Sets that RequestAuthentication
// rules name by jwksUri (or, with neither jwks nor jwksUri, find by OpenID
// Connect discovery from the issuer), so the control plane can hand
// waypoints the keys inline, as istiod resolves jwksUri for Envoy.
//
// A Resolver never blocks translation: Lookup answers from its cache, and
// a URI it has not fetched yet is fetched in the background (ErrPending
// until then); when a fetch changes what Lookup would answer, Changed
// fires and the control plane translates again. Key sets are refreshed
// every Refresh; a refresh that fails keeps the last good set (logged), a
// URI that never fetched keeps failing (every token of that issuer is
// rejected: fail closed), retried every Retry. URIs no translation asked
// for during Forget are dropped. Only http and https URIs are fetched, each
// answer at most MaxBody bytes and a JSON object with a keys array.
package jwks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
)

// Defaults, as istiod's JWKS resolver: refresh every 20 minutes, retry a
// failed fetch sooner.
const (
	DefaultRefresh = 20 * time.Minute
	DefaultRetry   = 30 * time.Second
	DefaultTimeout = 5 * time.Second
	DefaultForget  = time.Hour
	// MaxBody bounds a key set or discovery document.
	MaxBody = 1 << 20
)

// ErrPending is Lookup's error for a key set not fetched yet.
var ErrPending = errors.New("not fetched yet")

// ErrRefused is wrapped by the error of a fetch refused by the address or
// scheme rules (see the package comment).
var ErrRefused = errors.New("refused")

// Config configures a Resolver; zero fields take the defaults.
type Config struct {
	// Client does the fetches; nil: an http.Client with Timeout whose
	// dialer enforces the address rules. A Client given here is used as
	// is (tests).
	Client *http.Client
	// AllowHTTP lets http:// URIs be fetched; false: https only.
	AllowHTTP bool
	// AllowInternal lets fetches reach loopback, link-local and
	// cluster-internal addresses.
	AllowInternal bool
	// InternalCIDRs are the cluster's own ranges (Service CIDR, pod
	// CIDRs): never dialled unless AllowInternal.
	InternalCIDRs []netip.Prefix
	// Internal, if set, also reports addresses the cluster holds (a pod,
	// node or Service IP the control plane knows of): never dialled unless
	// AllowInternal.
	Internal func(netip.Addr) bool

	Timeout time.Duration
	Refresh time.Duration
	Retry   time.Duration
	Forget  time.Duration
	Log     *zap.Logger
	// Now is the clock; nil: time.Now. Tests set it.
	Now func() time.Time
}

// Resolver caches key sets by URI. Create it with New and Run it.
type Resolver struct {
	cfg     Config
	mu      sync.Mutex
	entries map[string]*entry // key: "uri <url>" or "issuer <iss>"
	wake    chan struct{}     // a new key to fetch
	changed chan struct{}     // cap 1: Lookup answers changed
}

type entry struct {
	keys      string // last good key set ("" none)
	err       error  // last fetch error (nil after a success)
	fetched   time.Time
	attempted time.Time
	used      time.Time
	busy      bool
	// retry spaces the attempts after a failure, from Config.Retry up to
	// maxRetry, and logs the streak once per backoff step.
	retry *backoff.Retry
	next  time.Time // when a failed entry is due again
}

// maxRetry caps the wait between attempts of a failing key set: ten times
// Retry, and never more than Refresh.
func (r *Resolver) maxRetry() time.Duration { return min(10*r.cfg.Retry, r.cfg.Refresh) }

// New returns a Resolver; Run fetches.
func New(cfg Config) *Resolver {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	r := &Resolver{entries: map[string]*entry{}, wake: make(chan struct{}, 1), changed: make(chan struct{}, 1)}
	if cfg.Client == nil {
		d := &net.Dialer{Timeout: cfg.Timeout, Control: r.checkDial}
		cfg.Client = &http.Client{
			Timeout: cfg.Timeout,
			// No proxy from the environment: the address checked at dial
			// time must be the key server's, not a proxy's.
			Transport: &http.Transport{DialContext: d.DialContext, TLSHandshakeTimeout: cfg.Timeout, ForceAttemptHTTP2: true},
			CheckRedirect: func(req *http.Request, via []*http.Request) error {
				if len(via) >= 5 {
					return errors.New("stopped after 5 redirects")
				}
				return r.checkURI(req.URL.String())
			},
		}
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.Forget <= 0 {
		cfg.Forget = DefaultForget
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r.cfg = cfg
	return r
}

// checkDial is the dialer's Control hook: it sees the resolved address
// about to be connected to, so DNS cannot smuggle a refused one past
// checkURI.
func (r *Resolver) checkDial(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("jwks: dial %s: %w", address, err)
	}
	return r.checkAddr(ap.Addr())
}

// checkAddr refuses the addresses a tenant must not make the control plane
// fetch from, unless AllowInternal.
func (r *Resolver) checkAddr(a netip.Addr) error {
	if r.cfg.AllowInternal {
		return nil
	}
	a = a.Unmap()
	why := ""
	switch {
	case a.IsLoopback():
		why = "loopback"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		why = "link-local"
	case a.IsUnspecified():
		why = "unspecified"
	case a.IsMulticast():
		why = "multicast"
	case r.cfg.Internal != nil && r.cfg.Internal(a):
		why = "held by a pod, node or Service of the cluster"
	default:
		for _, p := range r.cfg.InternalCIDRs {
			if p.Contains(a) {
				why = "in the cluster-internal range " + p.String()
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: address %s is %s (the control plane fetches keys only from outside the cluster unless the chart allows internal addresses: controlPlane.jwks.allowInternal)", ErrRefused, a, why)
}

// Changed fires (coalesced) when some Lookup would answer differently.
func (r *Resolver) Changed() <-chan struct{} { return r.changed }

// JWKS answers the key set at uri from the cache: the keys, or why there
// are none (ErrPending before the first fetch, else the fetch's error). It
// never blocks on the network.
func (r *Resolver) JWKS(uri string) (string, error) {
	if err := r.checkURI(uri); err != nil {
		return "", err
	}
	return r.lookup("uri " + uri)
}

// OIDC answers the key set of issuer found by OpenID Connect discovery
// (issuer/.well-known/openid-configuration, its jwks_uri), as JWKS does.
func (r *Resolver) OIDC(issuer string) (string, error) {
	if err := r.checkURI(issuer); err != nil {
		return "", fmt.Errorf("issuer is not a URL to discover keys from: %w", err)
	}
	return r.lookup("issuer " + issuer)
}

// checkURI checks the scheme, and a literal IP host (a name is checked
// when dialled).
func (r *Resolver) checkURI(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return err
	case u.Scheme == "http" && !r.cfg.AllowHTTP:
		return fmt.Errorf("%w: %q: only https is fetched (http needs the chart's controlPlane.jwks.allowHTTP)", ErrRefused, s)
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Errorf("%q: only https is fetched", s)
	case u.Host == "":
		return fmt.Errorf("%q: no host", s)
	}
	if a, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		if err := r.checkAddr(a); err != nil {
			return fmt.Errorf("%q: %w", s, err)
		}
	}
	return nil
}

func (r *Resolver) lookup(key string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[key]
	if e == nil {
		e = &entry{err: ErrPending, retry: backoff.New("jwks "+key,
			backoff.Policy{Initial: r.cfg.Retry, Max: r.maxRetry()}, r.cfg.Log)}
		r.entries[key] = e
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	e.used = r.cfg.Now()
	if e.keys != "" {
		return e.keys, nil
	}
	return "", e.err
}

// Run fetches new keys at once and refreshes known ones until ctx ends.
func (r *Resolver) Run(ctx context.Context) {
	tick := time.NewTicker(min(r.cfg.Retry, r.cfg.Refresh) / 2)
	defer tick.Stop()
	for {
		r.fetchDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-tick.C:
		}
	}
}

// fetchDue starts a fetch for every entry that is due: never attempted,
// failed and Retry passed, or fetched and Refresh passed; and drops
// entries unused for Forget.
func (r *Resolver) fetchDue(ctx context.Context) {
	now := r.cfg.Now()
	r.mu.Lock()
	var due []string
	for k, e := range r.entries {
		switch {
		case now.Sub(e.used) > r.cfg.Forget:
			delete(r.entries, k)
		case e.busy:
		case e.attempted.IsZero(),
			e.err != nil && !now.Before(e.next),
			e.err == nil && now.Sub(e.fetched) >= r.cfg.Refresh:
			e.busy, e.attempted = true, now
			due = append(due, k)
		}
	}
	r.mu.Unlock()
	for _, k := range due {
		go r.fetch(ctx, k)
	}
}

func (r *Resolver) fetch(ctx context.Context, key string) {
	kind, target, _ := strings.Cut(key, " ")
	var keys string
	var err error
	if kind == "issuer" {
		keys, err = r.discover(ctx, target)
	} else {
		keys, err = r.get(ctx, target)
	}
	r.mu.Lock()
	e := r.entries[key]
	if e == nil { // forgotten meanwhile
		r.mu.Unlock()
		return
	}
	e.busy = false
	before, beforeErr := e.keys, e.err
	if err != nil {
		e.err = err
		consequence := "tokens of this issuer are rejected until it succeeds"
		if e.keys != "" {
			consequence = "the last key set fetched stays in force"
		}
		e.next = r.cfg.Now().Add(e.retry.Failed(fmt.Errorf("%w; %s", err, consequence)))
	} else {
		e.keys, e.err, e.fetched = keys, nil, r.cfg.Now()
		e.retry.Succeeded()
		if keys != before {
			r.cfg.Log.Info("JWKS fetched", zap.String(kind, target), zap.Int("bytes", len(keys)))
		}
	}
	changed := e.keys != before || (e.keys == "" && errString(e.err) != errString(beforeErr))
	r.mu.Unlock()
	if changed {
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// get fetches a key set and checks its shape.
func (r *Resolver) get(ctx context.Context, uri string) (string, error) {
	body, err := r.getBody(ctx, uri)
	if err != nil {
		return "", err
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return "", fmt.Errorf("GET %s: not a JSON Web Key Set: %w", uri, err)
	}
	if len(set.Keys) == 0 {
		return "", fmt.Errorf("GET %s: the key set has no keys", uri)
	}
	return string(body), nil
}

// discover reads issuer's OpenID configuration and fetches its jwks_uri.
func (r *Resolver) discover(ctx context.Context, issuer string) (string, error) {
	doc := strings.TrimSuffix(issuer, "/") + "/.well-known/openid-configuration"
	body, err := r.getBody(ctx, doc)
	if err != nil {
		return "", err
	}
	var cfg struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.Unmarshal(body, &cfg); err != nil {
		return "", fmt.Errorf("GET %s: not an OpenID configuration: %w", doc, err)
	}
	if err := r.checkURI(cfg.JWKSURI); err != nil {
		return "", fmt.Errorf("GET %s: jwks_uri: %w", doc, err)
	}
	return r.get(ctx, cfg.JWKSURI)
}

func (r *Resolver) getBody(ctx context.Context, uri string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, uri, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", uri, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", uri, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", uri, err)
	}
	if len(body) > MaxBody {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", uri, MaxBody)
	}
	return body, nil
}
