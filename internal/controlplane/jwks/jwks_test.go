package jwks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/testing/testkit"
)

const keySet = `{"keys":[{"kty":"EC","crv":"P-256","x":"a","y":"b","kid":"k1"}]}`

func waitChanged(t *testing.T, r *Resolver, what string) {
	t.Helper()
	select {
	case <-r.Changed():
	case <-time.After(5 * time.Second):
		t.Fatalf("no change signalled: %s", what)
	}
}

// TestResolver: a jwksUri is pending until fetched, then answered from
// the cache; a failed refresh keeps the last good set; an answer that is
// not a key set, an error status or a non-http URI never yields keys; OIDC
// discovery follows the issuer's jwks_uri.
func TestResolver(t *testing.T) {
	var status atomic.Int32
	status.Store(200)
	var body atomic.Pointer[string]
	b := keySet
	body.Store(&b)
	mux := http.NewServeMux()
	mux.HandleFunc("/jwks.json", func(w http.ResponseWriter, _ *http.Request) {
		if s := int(status.Load()); s != 200 {
			http.Error(w, "down", s)
			return
		}
		w.Write([]byte(*body.Load()))
	})
	mux.HandleFunc("/notjson", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>")) })
	mux.HandleFunc("/empty", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(`{"keys":[]}`)) })
	var srvURL string
	mux.HandleFunc("/issuer/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"issuer":"` + srvURL + `/issuer","jwks_uri":"` + srvURL + `/jwks.json"}`))
	})
	srv := httptest.NewTLSServer(mux)
	defer srv.Close()
	srvURL = srv.URL
	r := New(Config{Client: srv.Client(), AllowInternal: true, Refresh: 100 * time.Millisecond, Retry: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	uri := srv.URL + "/jwks.json"
	if _, err := r.JWKS(uri); !errors.Is(err, ErrPending) {
		t.Fatalf("first lookup: %v, want ErrPending", err)
	}
	waitChanged(t, r, "first fetch")
	if keys, err := r.JWKS(uri); err != nil || keys != keySet {
		t.Fatalf("after the fetch: %q, %v", keys, err)
	}

	// The server fails: the last good set stays.
	status.Store(503)
	time.Sleep(400 * time.Millisecond)
	if keys, err := r.JWKS(uri); err != nil || keys != keySet {
		t.Fatalf("after a failed refresh: %q, %v; want the last good set", keys, err)
	}
	// It comes back with a rotated set: the new one is answered.
	rotated := strings.Replace(keySet, "k1", "k2", 1)
	body.Store(&rotated)
	status.Store(200)
	waitChanged(t, r, "rotation")
	if keys, _ := r.JWKS(uri); keys != rotated {
		t.Fatalf("after rotation: %q", keys)
	}

	for _, bad := range []string{srv.URL + "/notjson", srv.URL + "/empty", srv.URL + "/missing"} {
		r.JWKS(bad)
	}
	for _, bad := range []string{srv.URL + "/notjson", srv.URL + "/empty", srv.URL + "/missing"} {
		testkit.EventuallyErr(t, 5*time.Second, bad+" to fail", func() error {
			if _, err := r.JWKS(bad); err == nil || errors.Is(err, ErrPending) {
				return fmt.Errorf("still %v", err)
			}
			return nil
		})
	}
	if _, err := r.JWKS("file:///etc/passwd"); err == nil || !strings.Contains(err.Error(), "only https") {
		t.Errorf("file URI: %v", err)
	}

	if _, err := r.OIDC(srv.URL + "/issuer"); !errors.Is(err, ErrPending) {
		t.Fatalf("discovery before the fetch: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		waitChanged(t, r, "discovery")
		keys, err := r.OIDC(srv.URL + "/issuer")
		if err == nil && keys == rotated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovered keys: %q, %v", keys, err)
		}
	}
	if _, err := r.OIDC("spiffe-issuer"); err == nil {
		t.Error("an issuer that is not a URL was looked up")
	}
}

// TestResolverForgets: a URI no lookup asked for during Forget is dropped.
func TestResolverForgets(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(Config{Now: func() time.Time { return now }, Forget: time.Minute, Client: &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, errors.New("offline")
	})}})
	r.JWKS("https://issuer.example/jwks")
	now = now.Add(2 * time.Minute)
	r.fetchDue(context.Background())
	r.mu.Lock()
	n := len(r.entries)
	r.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d entries kept after Forget", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestResolverRefusesInternal: a tenant's jwksUri cannot make the control
// plane fetch from inside the cluster. http is refused without AllowHTTP;
// loopback, link-local (the cloud metadata address), cluster CIDR and
// cluster-held literal IPs are refused at lookup; a name that resolves to
// loopback is refused when dialled (what DNS rebinding would exploit), so
// no request reaches the server; with AllowHTTP and AllowInternal (the
// chart's opt-in) the same server is fetched.
func TestResolverRefusesInternal(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Write([]byte(keySet))
	}))
	defer srv.Close()
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	held := netip.MustParseAddr("203.0.113.7")
	r := New(Config{
		Retry: 50 * time.Millisecond, Refresh: time.Hour,
		InternalCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		Internal:      func(a netip.Addr) bool { return a == held },
	})
	for _, uri := range []string{
		srv.URL + "/jwks.json",                         // http
		"https://127.0.0.1:" + port + "/jwks.json",     // loopback
		"https://[::1]/jwks.json",                      // loopback
		"https://169.254.169.254/latest/meta-data",     // link-local: cloud metadata
		"https://10.96.0.10/jwks.json",                 // cluster CIDR
		"https://203.0.113.7/jwks.json",                // a cluster address
		"https://[::ffff:127.0.0.1]:" + port + "/jwks", // v4-mapped loopback
	} {
		if _, err := r.JWKS(uri); !errors.Is(err, ErrRefused) {
			t.Errorf("JWKS(%s) = %v, want ErrRefused", uri, err)
		}
	}
	if _, err := r.OIDC("http://issuer.example"); !errors.Is(err, ErrRefused) {
		t.Errorf("OIDC over http = %v, want ErrRefused", err)
	}

	// A name: only the dial can tell where it goes.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	byName := "https://localhost:" + port + "/jwks.json"
	if _, err := r.JWKS(byName); !errors.Is(err, ErrPending) {
		t.Fatalf("first lookup of %s: %v, want ErrPending", byName, err)
	}
	waitChanged(t, r, "the dial to localhost refused")
	if _, err := r.JWKS(byName); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("JWKS(%s) after the fetch = %v, want a loopback refusal", byName, err)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the key server got %d requests; a refused address must not be connected to", n)
	}

	// The chart's opt-in: the same loopback server over http is fetched.
	open := New(Config{AllowHTTP: true, AllowInternal: true})
	go open.Run(ctx)
	uri := srv.URL + "/jwks.json"
	if _, err := open.JWKS(uri); !errors.Is(err, ErrPending) {
		t.Fatalf("opt-in first lookup: %v, want ErrPending", err)
	}
	waitChanged(t, open, "the opted-in fetch")
	if keys, err := open.JWKS(uri); err != nil || keys != keySet {
		t.Fatalf("opt-in JWKS = %q, %v; want the key set", keys, err)
	}
}
