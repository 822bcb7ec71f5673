package waypoint

import (
	"errors"
	"io"
	"net/http"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/stream"
)

// isRefusal reports whether err is a filter's *stream.Refusal.
func isRefusal(err error) bool {
	var nr *stream.Refusal
	return errors.As(err, &nr)
}

// answerRefusal answers what decide refused (err), on either path, and
// returns the status.
func answerRefusal(rw http.ResponseWriter, r *http.Request, ex *exchange, err error) int {
	var nr *stream.Refusal
	code := http.StatusServiceUnavailable
	if errors.As(err, &nr) {
		code = nr.Code
	}
	ex.err = err
	switch {
	case code == http.StatusForbidden:
		rw.Header().Set("Content-Type", "text/plain")
		rw.WriteHeader(code)
		_, _ = io.WriteString(rw, DeniedBody)
	case code == http.StatusUnauthorized && nr != nil:
		// As Envoy's jwt_authn answers an invalid token.
		rw.Header().Set("Content-Type", "text/plain")
		rw.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+r.URL.Path+`", error="invalid_token"`)
		rw.WriteHeader(code)
		_, _ = io.WriteString(rw, nr.Body)
	case nr != nil && nr.Body != "":
		// A circuit breaker's overflow: Envoy's own body.
		rw.Header().Set("Content-Type", "text/plain")
		rw.WriteHeader(code)
		_, _ = io.WriteString(rw, nr.Body)
	default:
		http.Error(rw, http.StatusText(code), code)
	}
	return code
}
