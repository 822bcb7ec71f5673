// Package authntest mints what tests of the waypoint's authentication need:
// signing keys, the JWKS a RequestAuthentication carries, and signed tokens.
// Only tests import it; it never links into a binary.
package authntest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Key is a signing key and the id its public JWK carries.
type Key struct {
	Alg  jose.SignatureAlgorithm
	Priv crypto.Signer
	Kid  string
}

// NewKeys makes one RSA (RS256), one ECDSA (ES256) and one Ed25519 key.
func NewKeys(t testing.TB) (rsaKey, ecKey, edKey Key) {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, dk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return Key{jose.RS256, rk, "rsa-1"}, Key{jose.ES256, ek, "ec-1"}, Key{jose.EdDSA, dk, "ed-1"}
}

// JWKS is the public key set of keys, as a RequestAuthentication's jwks.
func JWKS(t testing.TB, keys ...Key) string {
	t.Helper()
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Priv.Public(), KeyID: k.Kid, Algorithm: string(k.Alg), Use: "sig"})
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Sign makes a compact JWT of claims with k (kid in the header unless
// noKid).
func Sign(t testing.TB, k Key, claims map[string]any, noKid bool) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	key := jose.JSONWebKey{Key: k.Priv, KeyID: k.Kid}
	if noKid {
		key.KeyID = ""
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Claims is a token payload from iss for sub, valid for an hour from now;
// extra are more claims as name, value pairs.
func Claims(iss, sub string, extra ...any) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": iss, "sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i].(string)] = extra[i+1]
	}
	return c
}
