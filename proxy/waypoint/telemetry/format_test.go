package telemetry

import (
	"net/netip"
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

// TestUpstreamHostOperator: %UPSTREAM_HOST% is the upstream's ip:port, as
// Envoy defines it, not the access line's "hbone ip:port".
func TestUpstreamHostOperator(t *testing.T) {
	ex := httpEntry(t)
	ex.Upstream, ex.UpstreamTo = "hbone", netip.MustParseAddrPort("[fd00::3]:9080")
	if got := string(render(nil, parseFormat(`"%UPSTREAM_HOST%"`), ex, "HTTP/1.1", "-")); got != `"[fd00::3]:9080"` {
		t.Errorf("rendered %s, want \"[fd00::3]:9080\"", got)
	}
	if got := upstreamText(ex.Upstream, ex.UpstreamTo); got != "hbone [fd00::3]:9080" {
		t.Errorf("upstreamText = %q, want the access line's \"hbone [fd00::3]:9080\"", got)
	}
	ex.Upstream, ex.UpstreamTo = "", netip.AddrPort{} // not routed: Envoy's "-"
	if got := string(render(nil, parseFormat(`%UPSTREAM_HOST%`), ex, "HTTP/1.1", "-")); got != "-" {
		t.Errorf("not routed: rendered %q, want -", got)
	}
}
