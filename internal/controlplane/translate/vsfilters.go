package translate

// The VirtualService http filters: corsPolicy, headers, rewrite and
// redirect, each converted to the waypoint's filter of the same meaning.

import (
	"math"
	"regexp"
	"strings"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// convertVSCors converts corsPolicy: allowOrigins (exact, prefix, regex)
// and the deprecated allowOrigin ("*" or exact); maxAge in whole seconds
// (unset: not sent); unmatchedPreflights IGNORE answers a preflight from
// another origin, FORWARD (the default) sends it upstream.
func convertVSCors(path string, c *networkingv1alpha3.CorsPolicy, bad *problems) *waypointapi.Cors {
	if c == nil {
		return nil
	}
	out := &waypointapi.Cors{AllowMethods: c.GetAllowMethods(), AllowHeaders: c.GetAllowHeaders(), ExposeHeaders: c.GetExposeHeaders(),
		MaxAgeS: -1, AllowCredentials: c.GetAllowCredentials().GetValue()}
	if c.GetUnmatchedPreflights() == networkingv1alpha3.CorsPolicy_IGNORE {
		out.UnmatchedPreflight = waypointapi.Cors_ANSWER
	}
	if d := c.GetMaxAge(); d != nil {
		out.MaxAgeS = int32(min(max(d.AsDuration().Milliseconds()/1000, 0), math.MaxInt32))
	}
	for _, o := range c.GetAllowOrigin() {
		if o == "*" {
			out.AllowOrigins = append(out.AllowOrigins, ".*")
		} else {
			out.AllowOrigins = append(out.AllowOrigins, regexp.QuoteMeta(o))
		}
	}
	for i, o := range c.GetAllowOrigins() {
		switch v := o.GetMatchType().(type) {
		case *networkingv1alpha3.StringMatch_Exact:
			out.AllowOrigins = append(out.AllowOrigins, regexp.QuoteMeta(v.Exact))
		case *networkingv1alpha3.StringMatch_Prefix:
			out.AllowOrigins = append(out.AllowOrigins, regexp.QuoteMeta(v.Prefix)+".*")
		case *networkingv1alpha3.StringMatch_Regex:
			if _, err := regexp.Compile(v.Regex); err != nil {
				bad.addf(fieldAt(path+".allowOrigins", i), "not an RE2 expression: %v", err)
				continue
			}
			out.AllowOrigins = append(out.AllowOrigins, v.Regex)
		default:
			bad.addf(fieldAt(path+".allowOrigins", i), "an empty match; requests this rule matches answer 500")
		}
	}
	return out
}

// istioHeaderOps converts a VirtualService HeaderOperations (nil: none).
func istioHeaderOps(h *networkingv1alpha3.Headers_HeaderOperations) *waypointapi.HeaderModifier {
	if h == nil || len(h.GetSet()) == 0 && len(h.GetAdd()) == 0 && len(h.GetRemove()) == 0 {
		return nil
	}
	return &waypointapi.HeaderModifier{Set: h.GetSet(), Add: h.GetAdd(), Remove: h.GetRemove()}
}

// convertVSRewrite converts rewrite: uri replaces the prefix a prefix
// match matched (Envoy's prefix_rewrite, a string prefix: the rule's
// prefix matches become STRING_PREFIX) or else the whole path;
// uriRegexRewrite replaces every match of its RE2 pattern, with Envoy's
// \1 group references; authority replaces the Host.
func convertVSRewrite(path string, rw *networkingv1alpha3.HTTPRewrite, bad *problems) *waypointapi.Rewrite {
	if rw == nil {
		return nil
	}
	out := &waypointapi.Rewrite{Host: rw.GetAuthority()}
	switch {
	case rw.GetUriRegexRewrite() != nil:
		rx := rw.GetUriRegexRewrite()
		if _, err := regexp.Compile(rx.GetMatch()); err != nil {
			bad.addf(path+".uriRegexRewrite.match", "not an RE2 expression: %v", err)
		}
		out.Path = &waypointapi.PathModifier{Type: waypointapi.PathModifier_REGEX, Pattern: rx.GetMatch(), Value: envoySubstitution(rx.GetRewrite())}
		if rw.GetUri() != "" {
			bad.addf(path+".uri", "uri and uriRegexRewrite are mutually exclusive")
		}
	case rw.GetUri() != "":
		out.Path = &waypointapi.PathModifier{Type: waypointapi.PathModifier_STRING_PREFIX, Value: rw.GetUri()}
	}
	return out
}

// envoySubstitution turns an Envoy regex substitution (\1 references a
// group) into Go's regexp.Expand template ($ escaped).
func envoySubstitution(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '$':
			b.WriteString("$$")
		case s[i] == '\\' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9':
			b.WriteString("${" + s[i+1:i+2] + "}")
			i++
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// convertVSRedirect converts redirect: uri replaces the whole path,
// prefixRewrite the matched prefix; authority the host; port, or the
// port derivePort names, else the Host's own port (Envoy's default);
// redirectCode defaults to 301.
func convertVSRedirect(path string, rd *networkingv1alpha3.HTTPRedirect, bad *problems) *waypointapi.Redirect {
	if rd == nil {
		return nil
	}
	out := &waypointapi.Redirect{Scheme: rd.GetScheme(), Host: rd.GetAuthority(), Code: rd.GetRedirectCode(), PortRule: waypointapi.Redirect_KEEP}
	if out.Code == 0 {
		out.Code = 301
	}
	switch out.Code {
	case 301, 302, 303, 307, 308:
	default:
		bad.addf(path+".redirectCode", "%d is not a redirect status (301, 302, 303, 307, 308); requests this rule matches answer 500", out.Code)
	}
	switch p := rd.GetRedirectPort().(type) {
	case *networkingv1alpha3.HTTPRedirect_Port:
		out.Port = p.Port
	case *networkingv1alpha3.HTTPRedirect_DerivePort:
		out.PortRule = waypointapi.Redirect_PROTOCOL_DEFAULT
		if p.DerivePort == networkingv1alpha3.HTTPRedirect_FROM_REQUEST_PORT {
			out.PortRule = waypointapi.Redirect_REQUEST_PORT
		}
	}
	switch {
	case rd.GetUri() != "" && rd.GetPrefixRewrite() != "":
		bad.addf(path+".prefixRewrite", "uri and prefixRewrite are mutually exclusive")
	case rd.GetUri() != "":
		out.Path = &waypointapi.PathModifier{Type: waypointapi.PathModifier_FULL, Value: rd.GetUri()}
	case rd.GetPrefixRewrite() != "":
		out.Path = &waypointapi.PathModifier{Type: waypointapi.PathModifier_STRING_PREFIX, Value: rd.GetPrefixRewrite()}
	}
	return out
}
