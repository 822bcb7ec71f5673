package routing

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// cors is a rule's compiled CORS policy (waypointapi.Cors).
type cors struct {
	origins []*regexp.Regexp
	// methods, headers, expose: the joined header values ("": not sent);
	// echoMethods/echoHeaders: "*" with credentials, so the preflight's
	// own request is echoed.
	methods, headers, expose string
	echoMethods, echoHeaders bool
	maxAge                   string // "": not sent
	credentials              bool
	answerUnmatched          bool
}

func compileCors(c *waypointapi.Cors) (*cors, bool) {
	if c == nil {
		return nil, true
	}
	out := &cors{credentials: c.GetAllowCredentials(), answerUnmatched: c.GetUnmatchedPreflight() == waypointapi.Cors_ANSWER}
	for _, o := range c.GetAllowOrigins() {
		re, err := regexp.Compile("^(?:" + o + ")$")
		if err != nil {
			return nil, false
		}
		out.origins = append(out.origins, re)
	}
	wild := func(vs []string) bool { return len(vs) == 1 && vs[0] == "*" }
	out.methods, out.echoMethods = strings.Join(c.GetAllowMethods(), ","), wild(c.GetAllowMethods()) && out.credentials
	out.headers, out.echoHeaders = strings.Join(c.GetAllowHeaders(), ","), wild(c.GetAllowHeaders()) && out.credentials
	if !(wild(c.GetExposeHeaders()) && out.credentials) {
		out.expose = strings.Join(c.GetExposeHeaders(), ",")
	}
	if c.GetMaxAgeS() >= 0 {
		out.maxAge = strconv.Itoa(int(c.GetMaxAgeS()))
	}
	return out, true
}

func (c *cors) allowed(origin string) bool {
	for _, re := range c.origins {
		if re.MatchString(origin) {
			return true
		}
	}
	return false
}

// corsState is what the CORS policy decided for one request.
type corsState uint8

const (
	corsNone      corsState = iota // no policy, or not a CORS request
	corsAllowed                    // from an allowed origin: the response gets the CORS headers
	corsPreflight                  // an allowed preflight: the waypoint answers it
	corsRefused                    // a preflight from another origin the waypoint answers without CORS headers
)

// decideCors classifies r against the rule's policy.
func (c *cors) decide(r *http.Request) (corsState, string) {
	origin := r.Header.Get("Origin")
	if c == nil || origin == "" {
		return corsNone, ""
	}
	preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	switch {
	case c.allowed(origin) && preflight:
		return corsPreflight, origin
	case c.allowed(origin):
		return corsAllowed, origin
	case preflight && c.answerUnmatched:
		return corsRefused, ""
	}
	return corsNone, ""
}

// preflight writes the answer to an allowed preflight r from origin.
func (c *cors) preflight(h http.Header, r *http.Request, origin string) {
	h.Set("Access-Control-Allow-Origin", origin)
	switch {
	case c.echoMethods:
		h.Set("Access-Control-Allow-Methods", r.Header.Get("Access-Control-Request-Method"))
	case c.methods != "":
		h.Set("Access-Control-Allow-Methods", c.methods)
	}
	switch {
	case c.echoHeaders:
		if v := r.Header.Get("Access-Control-Request-Headers"); v != "" {
			h.Set("Access-Control-Allow-Headers", v)
		}
	case c.headers != "":
		h.Set("Access-Control-Allow-Headers", c.headers)
	}
	if c.maxAge != "" {
		h.Set("Access-Control-Max-Age", c.maxAge)
	}
	if c.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
}

// response adds the CORS headers to the response to an allowed request
// from origin.
func (c *cors) response(h http.Header, origin string) {
	h.Set("Access-Control-Allow-Origin", origin)
	if c.expose != "" {
		h.Set("Access-Control-Expose-Headers", c.expose)
	}
	if c.credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
}
