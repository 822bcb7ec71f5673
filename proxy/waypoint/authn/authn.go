// Package authn is the waypoint's authentication filter: it validates the
// JWTs of the RequestAuthentications that apply to a request (keys parsed
// once per config), as Envoy's jwt_authn does for Istio. No token is
// anonymous; an invalid one is an *Error, answered 401 before any policy
// runs; a valid one gives the request principal and claims authorization
// matches (stream.RequestAuth).
package authn

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// jwtLeeway is the clock skew allowed on exp and nbf: Envoy's jwt_authn
// default (clock_skew_seconds 60), which Istio's waypoint uses.
const jwtLeeway = 60 * time.Second

// jwtAlgorithms are the signature algorithms a token may use: the
// asymmetric ones (RSA, RSA-PSS, ECDSA, Ed25519). A JWKS carries public
// keys only; HMAC would need a shared secret in the policy.
var jwtAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// The 401 bodies, Envoy's jwt_authn messages (what a client of Istio's
// waypoint reads).
const (
	errJwtMalformed   = "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
	errJwtVerify      = "Jwt verification fails"
	errJwtExpired     = "Jwt is expired"
	errJwtNotYet      = "Jwt not yet valid"
	errJwtAudience    = "Audiences in Jwt are not allowed"
	errJwtIssuer      = "Jwt issuer is not configured"
	errJwtNoKey       = "Jwks doesn't have key to match kid or alg from Jwt"
	defaultAuthHeader = "Authorization"
	defaultAuthPrefix = "Bearer "
	defaultAuthParam  = "access_token"
)

// Policy is one RequestAuthentication, compiled once per config.
type Policy struct {
	key      string          // ns/name
	services map[string]bool // nil: every request at this waypoint
	rules    []*jwtRule
}

// jwtRule is one jwtRules entry with its key set parsed.
type jwtRule struct {
	policy    string
	issuer    string
	audiences []string
	keys      []jose.JSONWebKey // public keys only
	// unusable is why tokens of this issuer are rejected ("" when keys
	// are usable): the control plane's error, or a JWKS without a key.
	unusable string
	headers  []jwtHeader
	params   []string
	forward  bool
	claimOut []claimHeader
}

type jwtHeader struct{ name, prefix string }

type claimHeader struct {
	header string
	claim  []string // nested path ("a.b" → [a b])
}

func Compile(in []*waypointapi.RequestAuthn) []*Policy {
	out := make([]*Policy, 0, len(in))
	for _, ra := range in {
		p := &Policy{key: ra.GetNamespace() + "/" + ra.GetName()}
		if len(ra.GetServices()) > 0 {
			p.services = map[string]bool{}
			for _, s := range ra.GetServices() {
				p.services[s] = true
			}
		}
		for _, r := range ra.GetRules() {
			p.rules = append(p.rules, compileJwtRule(p.key, r))
		}
		out = append(out, p)
	}
	return out
}

func compileJwtRule(policy string, r *waypointapi.JwtRule) *jwtRule {
	jr := &jwtRule{policy: policy, issuer: r.GetIssuer(), audiences: r.GetAudiences(), params: r.GetFromParams(),
		forward: r.GetForwardOriginalToken()}
	for _, h := range r.GetFromHeaders() {
		jr.headers = append(jr.headers, jwtHeader{name: h.GetName(), prefix: h.GetPrefix()})
	}
	if len(jr.headers) == 0 && len(jr.params) == 0 {
		jr.headers = []jwtHeader{{defaultAuthHeader, defaultAuthPrefix}}
		jr.params = []string{defaultAuthParam}
	}
	for _, c := range r.GetOutputClaimToHeaders() {
		jr.claimOut = append(jr.claimOut, claimHeader{header: c.GetHeader(), claim: strings.Split(c.GetClaim(), ".")})
	}
	if e := r.GetError(); e != "" {
		jr.unusable = e
		return jr
	}
	keys, err := parseJWKS(r.GetJwks())
	if err != nil {
		jr.unusable = err.Error()
	}
	jr.keys = keys
	return jr
}

// parseJWKS reads a JSON Web Key Set, keeping the public keys of the types
// a token can be verified with; a key that does not parse is skipped, as
// long as one is left.
func parseJWKS(s string) ([]jose.JSONWebKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal([]byte(s), &set); err != nil {
		return nil, fmt.Errorf("jwks is not a JSON Web Key Set: %w", err)
	}
	var keys []jose.JSONWebKey
	var errs []error
	for i, raw := range set.Keys {
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			errs = append(errs, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		if k.Use == "enc" {
			continue
		}
		pub := k.Public()
		switch pub.Key.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
			keys = append(keys, pub)
		default:
			errs = append(errs, fmt.Errorf("key %d: type %T cannot verify a token", i, k.Key))
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("jwks has no usable public key: %w", errors.Join(append(errs, errors.New("no keys"))...))
	}
	return keys, nil
}

// Error is a rejected token: answered 401 with msg as the body;
// detail (for the access log only) says more.
type Error struct {
	policy, issuer, msg, detail string
}

// Body is the 401 body: Envoy's jwt_authn message.
func (e *Error) Body() string { return e.msg }

func (e *Error) Error() string {
	s := "authentication: " + e.msg
	if e.policy != "" {
		s = fmt.Sprintf("authentication (%s, issuer %q): %s", e.policy, e.issuer, e.msg)
	}
	if e.detail != "" {
		s += " (" + e.detail + ")"
	}
	return s
}

// foundToken is a token and where it was read.
type foundToken struct {
	token  string
	header string // "" when from a query parameter
}

// Authenticate validates the JWTs of r against the RequestAuthentications
// that apply to service, as Envoy's jwt_authn with Istio's "any provider, or
// no token" requirement: no token → anonymous (nil, nil); a token valid for
// a rule of its issuer → its identity; any other token → an *Error
// (401). On success the token is removed unless the rule forwards it, and
// claims are copied into headers (outputClaimToHeaders); those headers are
// always cleared first so a client cannot forge them.
func Authenticate(policies []*Policy, service string, r *http.Request, now time.Time) (*stream.RequestAuth, error) {
	var rules []*jwtRule
	for _, p := range policies {
		if p.services == nil || p.services[service] {
			rules = append(rules, p.rules...)
		}
	}
	if len(rules) == 0 {
		return nil, nil
	}
	for _, jr := range rules {
		for _, c := range jr.claimOut {
			r.Header.Del(c.header)
		}
	}
	var query map[string][]string
	var firstErr *Error
	seen := map[string]bool{}
	for _, jr := range rules {
		for _, ft := range jr.tokens(r, &query) {
			if seen[ft.token] {
				continue
			}
			auth, err := verifyToken(rules, ft.token, now)
			if err != nil {
				seen[ft.token] = true
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			if !auth.rule.forward && ft.header != "" {
				r.Header.Del(ft.header)
			}
			for _, c := range auth.rule.claimOut {
				if v, ok := claimString(auth.Claims, c.claim); ok {
					r.Header.Set(c.header, v)
				}
			}
			return &auth.RequestAuth, nil
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, nil
}

// tokens reads the tokens at the rule's locations.
func (jr *jwtRule) tokens(r *http.Request, query *map[string][]string) []foundToken {
	var out []foundToken
	for _, h := range jr.headers {
		for _, v := range r.Header.Values(h.name) {
			if h.prefix != "" {
				if len(v) < len(h.prefix) || !strings.EqualFold(v[:len(h.prefix)], h.prefix) {
					continue // another scheme (Basic): not this rule's token
				}
				v = v[len(h.prefix):]
			}
			if v = strings.TrimSpace(v); v != "" {
				out = append(out, foundToken{token: v, header: h.name})
			}
		}
	}
	if len(jr.params) > 0 {
		if *query == nil {
			*query = r.URL.Query()
		}
		for _, p := range jr.params {
			for _, v := range (*query)[p] {
				if v != "" {
					out = append(out, foundToken{token: v})
				}
			}
		}
	}
	return out
}

type verified struct {
	stream.RequestAuth
	rule *jwtRule
}

// verifyToken checks one token against the rules of its issuer: signature by
// a key of the rule's set, exp and nbf with jwtLeeway, and the audiences.
func verifyToken(rules []*jwtRule, token string, now time.Time) (*verified, *Error) {
	tok, err := jwt.ParseSigned(token, jwtAlgorithms)
	if err != nil {
		if strings.Count(token, ".") != 2 {
			return nil, &Error{msg: errJwtMalformed}
		}
		return nil, &Error{msg: errJwtVerify}
	}
	var unverified struct {
		Issuer string `json:"iss"`
	}
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, &Error{msg: errJwtVerify}
	}
	var firstErr *Error
	for _, jr := range rules {
		if jr.issuer != unverified.Issuer {
			continue
		}
		v, err := jr.verify(tok, now)
		if err == nil {
			return v, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, &Error{issuer: unverified.Issuer, msg: errJwtIssuer}
}

func (jr *jwtRule) verify(tok *jwt.JSONWebToken, now time.Time) (*verified, *Error) {
	fail := func(msg string) (*verified, *Error) {
		return nil, &Error{policy: jr.policy, issuer: jr.issuer, msg: msg}
	}
	if jr.unusable != "" {
		// Fail closed: a rule whose keys could not be had rejects every
		// token of its issuer.
		return nil, &Error{policy: jr.policy, issuer: jr.issuer, msg: errJwtVerify, detail: jr.unusable}
	}
	h := tok.Headers[0]
	var std jwt.Claims
	var raw map[string]any
	matched := false
	for i := range jr.keys {
		k := &jr.keys[i]
		if h.KeyID != "" && k.KeyID != h.KeyID || !keyFits(k, h.Algorithm) {
			continue
		}
		matched = true
		if err := tok.Claims(k.Key, &std, &raw); err == nil {
			return jr.checkClaims(&std, raw, now)
		}
	}
	if !matched {
		return fail(errJwtNoKey)
	}
	return fail(errJwtVerify)
}

// keyFits reports whether a key can check a signature of algorithm alg.
func keyFits(k *jose.JSONWebKey, alg string) bool {
	if k.Algorithm != "" && k.Algorithm != alg {
		return false
	}
	switch k.Key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		return strings.HasPrefix(alg, "ES")
	case ed25519.PublicKey:
		return alg == string(jose.EdDSA)
	}
	return false
}

func (jr *jwtRule) checkClaims(std *jwt.Claims, raw map[string]any, now time.Time) (*verified, *Error) {
	fail := func(msg string) (*verified, *Error) {
		return nil, &Error{policy: jr.policy, issuer: jr.issuer, msg: msg}
	}
	if std.Expiry != nil && now.After(std.Expiry.Time().Add(jwtLeeway)) {
		return fail(errJwtExpired)
	}
	if std.NotBefore != nil && now.Add(jwtLeeway).Before(std.NotBefore.Time()) {
		return fail(errJwtNotYet)
	}
	if len(jr.audiences) > 0 {
		ok := false
		for _, a := range std.Audience {
			for _, want := range jr.audiences {
				if a == want {
					ok = true
				}
			}
		}
		if !ok {
			return fail(errJwtAudience)
		}
	}
	return &verified{rule: jr, RequestAuth: stream.RequestAuth{
		Principal: std.Issuer + "/" + std.Subject,
		Audiences: []string(std.Audience),
		Presenter: stringClaim(raw["azp"]),
		Claims:    raw,
	}}, nil
}

func stringClaim(v any) string {
	s, _ := v.(string)
	return s
}

// claimString renders a claim (nested path) for a header: strings as they
// are, numbers and booleans in JSON; objects and lists are not copied.
func claimString(claims map[string]any, path []string) (string, bool) {
	v, ok := (&stream.RequestAuth{Claims: claims}).Claim(path)
	if !ok {
		return "", false
	}
	switch x := v.(type) {
	case string:
		return x, true
	case bool:
		return strconv.FormatBool(x), true
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), true
	}
	return "", false
}
