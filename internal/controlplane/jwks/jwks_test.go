package jwks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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
	r := New(Config{Client: srv.Client(), Refresh: 100 * time.Millisecond, Retry: 100 * time.Millisecond})
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
	if _, err := r.JWKS("file:///etc/passwd"); err == nil || !strings.Contains(err.Error(), "only http and https") {
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
