package telemetry

import (
	"testing"
)

// TestBytesOperators: %BYTES_RECEIVED% and %BYTES_SENT% are the bodies'
// sizes, as Envoy defines them for HTTP, not the whole messages' that the
// byte histograms count.
func TestBytesOperators(t *testing.T) {
	ex := httpEntry(t)
	ex.Sizes = Sizes{Request: 180, Response: 140, RequestBody: 0, ResponseBody: 5}
	got := string(render(nil, parseFormat("%BYTES_RECEIVED% %BYTES_SENT%"), ex, "HTTP/1.1", "-"))
	if got != "0 5" {
		t.Fatalf("rendered %q, want the body sizes \"0 5\"", got)
	}
}
