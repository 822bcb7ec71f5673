package translate

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"

	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

const kindRA = "RequestAuthentication"

// requiredPolicySuffix names the DENY policy that stands for a jwtRule
// with presence REQUIRED ("<name>.required-jwt"): the waypoint has no
// notion of a required token, so a request without a valid token of that
// issuer is denied (403; Istio answers 401).
const requiredPolicySuffix = ".required-jwt"

// authnState is what WaypointConfigs learns of the RequestAuthentications
// while it builds each waypoint's config: each one converted once, and
// which waypoints carry it.
type authnState struct {
	converted  map[string]*convertedAuthn // ns/name
	enforcedBy map[string][]string        // ns/name → waypoints
}

type convertedAuthn struct {
	rules    []*waypointapi.JwtRule
	required []string // issuers whose rule has presence REQUIRED
	bad      []string
}

func newAuthnState() *authnState {
	return &authnState{converted: map[string]*convertedAuthn{}, enforcedBy: map[string][]string{}}
}

func raTargetRefs(ra *securityv1.RequestAuthentication) []*targetRef {
	var out []*targetRef
	if r := ra.Spec.TargetRef; r != nil {
		out = append(out, &targetRef{r.Group, r.Kind, r.Name, r.Namespace})
	}
	for _, r := range ra.Spec.TargetRefs {
		out = append(out, &targetRef{r.Group, r.Kind, r.Name, r.Namespace})
	}
	return out
}

// authnFor returns the RequestAuthentications that attach to waypoint key
// ("ns/name" of its Gateway) with targetRefs, as Istio attaches them: the
// Gateway in the policy's namespace, GatewayClass istio-waypoint from the
// root namespace (every waypoint), or a Service or ServiceEntry in the
// policy's namespace that is bound to this waypoint (bound: "Service ns/name"
// → hostnames, from boundTo). A presence REQUIRED rule also yields a DENY
// policy (see requiredPolicySuffix).
func (t *translator) authnFor(key string, bound map[string][]string, st *authnState) ([]*waypointapi.RequestAuthn, []*waypointapi.Policy) {
	var out []*waypointapi.RequestAuthn
	var pols []*waypointapi.Policy
	for _, ra := range t.objs.RequestAuthentications {
		whole := false
		var hosts, targets []string
		for _, r := range raTargetRefs(ra) {
			if r.namespace != "" && r.namespace != ra.Namespace {
				continue
			}
			switch {
			case r.group == "gateway.networking.k8s.io" && r.kind == "Gateway":
				if ra.Namespace+"/"+r.name == key {
					whole = true
					targets = append(targets, "Gateway "+key)
				}
			case r.group == "gateway.networking.k8s.io" && r.kind == "GatewayClass":
				if r.name == WaypointClass && ra.Namespace == t.cfg.RootNamespace {
					whole = true
					targets = append(targets, "GatewayClass "+WaypointClass)
				}
			case (r.group == "" || r.group == "core") && r.kind == "Service", r.group == "networking.istio.io" && r.kind == "ServiceEntry":
				if h, ok := bound[r.kind+" "+ra.Namespace+"/"+r.name]; ok {
					hosts = append(hosts, h...)
					targets = append(targets, r.kind+" "+ra.Namespace+"/"+r.name)
				}
			}
		}
		if !whole && len(hosts) == 0 {
			continue
		}
		rk := ra.Namespace + "/" + ra.Name
		conv := st.converted[rk]
		if conv == nil {
			conv = convertRequestAuthn(ra, t.cfg.JWKS)
			st.converted[rk] = conv
		}
		a := &waypointapi.RequestAuthn{Name: ra.Name, Namespace: ra.Namespace, Rules: conv.rules, Target: strings.Join(targets, ", ")}
		if !whole {
			a.Services = dedupe(hosts)
		}
		out = append(out, a)
		for _, iss := range conv.required {
			pols = append(pols, &waypointapi.Policy{
				Name: ra.Name + requiredPolicySuffix, Namespace: ra.Namespace, Action: waypointapi.Action_DENY,
				Services: a.Services, Target: a.Target,
				Rules: []*waypointapi.Rule{{From: []*waypointapi.Source{{
					NotRequestPrincipals: []*waypointapi.StringMatch{{MatchType: &waypointapi.StringMatch_Prefix{Prefix: iss + "/"}}},
				}}}},
			})
		}
		st.enforcedBy[rk] = append(st.enforcedBy[rk], key)
	}
	return out, pols
}

// convertRequestAuthn converts the jwtRules. What the waypoint cannot do
// is listed in bad and narrows access: a rule whose key set is not known
// (no resolver for jwksUri or OIDC discovery, or not fetched, or the fetch
// failed) or does not parse carries an error, so every token of its issuer
// is rejected (401). Fetched key sets are sent inline, as istiod does.
func convertRequestAuthn(ra *securityv1.RequestAuthentication, keys JWKSResolver) *convertedAuthn {
	c := &convertedAuthn{}
	var bad problems
	for i, r := range ra.Spec.JwtRules {
		path := fieldAt("spec.jwtRules", i)
		if r == nil {
			continue
		}
		jr := &waypointapi.JwtRule{Issuer: r.Issuer, Audiences: r.Audiences, Jwks: r.Jwks, FromParams: r.FromParams, ForwardOriginalToken: r.ForwardOriginalToken}
		for _, h := range r.FromHeaders {
			jr.FromHeaders = append(jr.FromHeaders, &waypointapi.JwtHeader{Name: h.GetName(), Prefix: h.GetPrefix()})
		}
		for _, o := range r.OutputClaimToHeaders {
			jr.OutputClaimToHeaders = append(jr.OutputClaimToHeaders, &waypointapi.ClaimToHeader{Header: o.GetHeader(), Claim: o.GetClaim()})
		}
		reject := func(field, why string) {
			bad.addf(path+field, "%s; every token of issuer %q is rejected (401)", why, r.Issuer)
			if jr.Error == "" {
				jr.Error = why
			}
		}
		switch {
		case r.Issuer == "":
			reject(".issuer", "empty issuer")
		case r.Jwks != "":
			if why := checkJWKS(r.Jwks); why != "" {
				reject(".jwks", why)
			}
		case r.JwksUri != "" && keys == nil:
			reject(".jwksUri", "jwksUri "+r.JwksUri+" is not fetched: this control plane has no JWKS resolver (inline jwks only)")
		case r.JwksUri != "":
			set, err := keys.JWKS(r.JwksUri)
			if err == nil {
				if why := checkJWKS(set); why != "" {
					err = errors.New(why)
				}
			}
			if err != nil {
				reject(".jwksUri", "jwksUri "+r.JwksUri+": "+err.Error())
			} else {
				jr.Jwks = set
			}
		case keys == nil:
			reject(".jwks", "no jwks: OpenID discovery is not done by this control plane (no JWKS resolver; inline jwks only)")
		default:
			set, err := keys.OIDC(r.Issuer)
			if err == nil {
				if why := checkJWKS(set); why != "" {
					err = errors.New(why)
				}
			}
			if err != nil {
				reject(".jwks", "no jwks, and OpenID discovery from issuer "+r.Issuer+" gave none: "+err.Error())
			} else {
				jr.Jwks = set
			}
		}
		if len(r.FromCookies) > 0 {
			if len(r.FromHeaders)+len(r.FromParams) == 0 {
				// The waypoint would read the default locations instead.
				reject(".fromCookies", "tokens in cookies are not read by ztunnel-go's waypoint")
			} else {
				bad.addf(path+".fromCookies", "tokens in cookies are not read by ztunnel-go's waypoint; such a request is anonymous")
			}
		}
		if r.OutputPayloadToHeader != "" {
			bad.addf(path+".outputPayloadToHeader", "not supported by ztunnel-go's waypoint; header %q is not set", r.OutputPayloadToHeader)
		}
		if len(r.SpaceDelimitedClaims) > 0 {
			bad.addf(path+".spaceDelimitedClaims", "not supported by ztunnel-go's waypoint (only scope and permission are split); %s compare as whole strings",
				strings.Join(r.SpaceDelimitedClaims, ", "))
		}
		if r.Presence == securityv1beta1.JWTRule_REQUIRED && r.Issuer != "" {
			c.required = append(c.required, r.Issuer)
			bad.addf(path+".presence", "REQUIRED is enforced as a DENY policy %s%s: a request without a valid token of issuer %q is denied with 403 (Istio answers 401)",
				ra.Name, requiredPolicySuffix, r.Issuer)
		}
		c.rules = append(c.rules, jr)
	}
	c.bad = bad
	return c
}

// checkJWKS says why an inline key set cannot be used ("" when it can): it
// must be a JSON object with a keys array of objects that each name a kty.
// The waypoint parses the keys themselves.
func checkJWKS(s string) string {
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal([]byte(s), &set); err != nil {
		return "jwks is not a JSON Web Key Set: " + err.Error()
	}
	if len(set.Keys) == 0 {
		return "jwks has no keys"
	}
	for _, k := range set.Keys {
		if kty, _ := k["kty"].(string); kty != "" {
			return ""
		}
	}
	return "jwks has no key with a kty"
}

// translateRequestAuthentications gives each RequestAuthentication its
// status: node proxies never get one (they cannot validate a JWT, and
// their policies that need a request principal fail closed), so each is
// "not enforced" until WaypointConfigs finds the waypoints it attaches to
// (setAuthnStatus); what cannot be enforced is in Invalid.
func (t *translator) translateRequestAuthentications() {
	for _, ra := range t.objs.RequestAuthentications {
		s := PolicyStatus{Kind: kindRA, Name: ra.Namespace + "/" + ra.Name, Invalid: convertRequestAuthn(ra, t.cfg.JWKS).bad}
		if len(raTargetRefs(ra)) > 0 {
			s.Message = "not enforced: its targetRefs name no waypoint and no service bound to one"
		} else {
			s.Message = "not enforced: node proxies cannot validate JWTs; attach it to a waypoint with targetRefs"
		}
		t.policies = append(t.policies, s)
	}
}

// setAuthnStatus rewrites the status of a RequestAuthentication that
// waypoint configs carry.
func setAuthnStatus(st *PolicyStatus, as *authnState) {
	if conv := as.converted[st.Name]; conv != nil {
		// Converted now, with the key sets fetched since the last full
		// translation.
		st.Invalid = conv.bad
	}
	wps := as.enforcedBy[st.Name]
	if len(wps) == 0 {
		return
	}
	wps = dedupe(wps)
	sort.Strings(wps)
	st.Message = EnforcedByWaypoint + strings.Join(wps, ", ") + " (targetRefs make it a waypoint policy; node proxies never get it)"
}
