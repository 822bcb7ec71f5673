package routing

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/proxy/route"
)

// mirrorBodyMax is the largest request body that is mirrored: a body must
// be held in memory to be sent twice. A request with a larger (or unknown)
// length is not mirrored, and the access log says so.
const mirrorBodyMax = 64 << 10

// mirrorTimeout bounds each mirrored request; its answer is discarded.
const mirrorTimeout = 5 * time.Second

// StartMirrors sends a copy of r to each of the rule's mirrors (as many as
// their percent picks), in the background, as Envoy's request mirroring
// does: the Host gets a "-shadow" suffix, the response is drained and
// dropped, and a failure never touches the original request. It may
// replace r.Body with a replayable copy (which also lets retries replay
// it). base sends the copies (the protocol the client spoke). It returns
// what it did, for the access log.
func (rt *Router) StartMirrors(rule *Rule, snap *state.Snapshot, src, dst netip.AddrPort, r *http.Request, base http.RoundTripper) string {
	var picked []mirror
	for _, m := range rule.mirrors {
		if m.percent >= 100 || rt.rand(100) < m.percent {
			picked = append(picked, m)
		}
	}
	if len(picked) == 0 {
		return ""
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength < 0 || r.ContentLength > mirrorBodyMax {
			return "skipped: body too large or of unknown length"
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, mirrorBodyMax+1))
		if err != nil || len(b) > mirrorBodyMax {
			return "skipped: body unreadable"
		}
		body = b
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	sent := 0
	for _, m := range picked {
		port := m.backend.port
		if port == 0 {
			port = dst.Port()
		}
		d, err := rt.mirrorDecision(snap, &m.backend, dst, port)
		if err != nil {
			rt.log.Debug("mirror not sent", zap.String("backend", m.backend.hostname), zap.Error(err))
			continue
		}
		target := Target(d)
		if d.Kind == route.DoubleHBONE {
			t, ok := serviceAddr(snap, rt.ip, d.Service, d.Authority.Port())
			if !ok {
				rt.log.Debug("mirror not sent: no service address on this network", zap.String("backend", m.backend.hostname))
				continue
			}
			target = t
		}
		ctx, cancel := context.WithTimeout(context.Background(), mirrorTimeout)
		out := r.Clone(ctx)
		out.Host = r.Host + "-shadow"
		out.URL.Scheme, out.URL.Host = "http", target.String()
		out.RequestURI = ""
		out.Body, out.GetBody, out.ContentLength = http.NoBody, nil, 0
		if body != nil {
			out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		applyHeaderOps(rule.reqMods, out.Header)
		out.Header.Set("X-Forwarded-For", src.Addr().String())
		sent++
		go func() { // bounded by mirrorTimeout
			defer cancel()
			resp, err := base.RoundTrip(out)
			if err != nil {
				rt.log.Debug("mirror failed", zap.String("backend", m.backend.hostname), zap.Error(err))
				return
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
		}()
	}
	if sent == 0 {
		return "skipped: backend unresolved"
	}
	return "sent"
}
