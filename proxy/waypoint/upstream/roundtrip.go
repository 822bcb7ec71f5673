package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/wire"
)

// Attempt is one exchange with an endpoint: the response head (its body
// still to read on Conn) or the error; Wait reports the streamed body's
// writer goroutine.
type Attempt struct {
	Resp *http.Response
	Conn *Conn
	Err  error
	body chan error // nil: the body went with the head
}

// Wait waits for a streamed body's writer once the response is through;
// false: it failed, or was still writing and the connection was closed to
// end it (the endpoint answered without reading it all). Either way the
// connection is not reused.
func (a *Attempt) Wait() bool {
	if a.body == nil {
		return true
	}
	select {
	case err := <-a.body:
		return err == nil
	default:
	}
	a.Conn.nc.Close()
	<-a.body
	return false
}

// RoundTrip sends request r to target: head (its request line, header
// and any held body, wire.AppendRequestHead), then what is left of its
// body from stream (nil: nothing; chunked: framed so), and reads the
// response head. A kept connection the endpoint had closed meanwhile is
// replaced once by a new one when the body can be sent again.
// lim: the connectionPool settings of the request's destination.
func (h *Held) RoundTrip(target netip.AddrPort, r *http.Request, head []byte, stream io.Reader, chunked bool, deadline time.Time, lim Limits) Attempt {
	for fresh := false; ; fresh = true {
		uc, err := h.upstream(target, fresh, deadline, lim)
		if err != nil {
			return Attempt{Err: TimeoutErr(err)}
		}
		uc.uses++
		uc.idle = lim.IdleTimeout
		if lim.MaxUses > 0 && uc.uses >= lim.MaxUses {
			uc.last = true
		}
		if !deadline.IsZero() {
			_ = uc.nc.SetDeadline(deadline) // cleared by done before the connection is kept
		}
		a := Attempt{Conn: uc}
		_, err = uc.nc.Write(head)
		if err == nil && stream != nil {
			// Streamed: its own goroutine writes the body while this one
			// reads the response (which may come first).
			a.body = make(chan error, 1)
			go func() {
				err := copyBody(uc.nc, stream, chunked)
				if errors.Is(err, errBodyRead) {
					uc.nc.Close() // the endpoint would wait for the rest
				}
				a.body <- err
			}()
		}
		if err == nil {
			a.Resp, err = readResponse(uc, r)
		}
		if err == nil {
			return a
		}
		uc.nc.Close()
		if a.body != nil {
			<-a.body
		}
		if uc.reused && stream == nil && !wire.IsTimeout(err) {
			continue // stale: try once on a new connection
		}
		return Attempt{Err: TimeoutErr(fmt.Errorf("upstream %s: %w", target, err))}
	}
}

// readResponse reads the response head, skipping 1xx informational ones (a
// 101 is refused: the fast path never asks for an upgrade).
func readResponse(uc *Conn, r *http.Request) (*http.Response, error) {
	for {
		resp := quickResponse(uc.br, r)
		if resp == nil {
			var err error
			if resp, err = http.ReadResponse(uc.br, r); err != nil {
				return nil, err
			}
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, errors.New("unrequested 101 Switching Protocols")
		}
		if resp.StatusCode >= 200 || resp.StatusCode < 100 {
			return resp, nil
		}
	}
}

// TimeoutErr makes a deadline's error one net/http's path would report
// (context.DeadlineExceeded: a 504 and the UT flag).
func TimeoutErr(err error) error {
	if wire.IsTimeout(err) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
	}
	return err
}

// Done returns an upstream connection after its exchange: kept when clean
// (reuse) for the next request. deadline: the exchange set one, cleared
// before the connection is kept.
func (h *Held) Done(uc *Conn, reuse, deadline bool) {
	if uc.last {
		reuse = false
	}
	if deadline && reuse {
		reuse = uc.nc.SetDeadline(time.Time{}) == nil
	}
	if !reuse {
		uc.nc.Close()
		return
	}
	h.release(uc)
}
