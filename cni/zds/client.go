package zds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon/backoff"
	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// Client-side defaults (docs/protocol.md#zds).
const (
	DefaultMinBackoff = 10 * time.Millisecond
	DefaultMaxBackoff = 15 * time.Second
)

// Handler is the node proxy's side of ZDS. The Client calls it from one
// goroutine, one message at a time, and acks each message with the returned
// error's text (nil = ACK).
type Handler interface {
	// Add starts (or confirms) the proxy of pod uid in network namespace ns.
	// Add owns ns in every case and closes it when it no longer needs it,
	// including when it returns an error (a proxy that failed to start may
	// keep ns to retry later).
	Add(uid string, info *zdsapi.WorkloadInfo, ns *netns.Handle) error
	// Keep keeps the proxy of pod uid whose netns the agent no longer knows
	// (sent during a snapshot only).
	Keep(uid string) error
	// Del stops the proxy of pod uid.
	Del(uid string) error
	// SnapshotSent ends a snapshot: seen holds every uid added or kept since
	// this connection's hello, sorted. Proxies of pods not in seen are
	// stopped.
	SnapshotSent(seen []string) error
}

// ClientConfig configures NewClient.
type ClientConfig struct {
	// Path of the agent's socket. Required.
	Path string
	// Handler receives the pods. Required.
	Handler Handler
	// Log receives connection events; nil means no logging.
	Log *zap.Logger
	// MinBackoff and MaxBackoff bound the wait between connection attempts,
	// doubling from min to max and starting over once the agent has sent a
	// message on a connection; 0
	// means DefaultMinBackoff / DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Retry paces reconnects and reports their state (the daemon's
	// readiness page and config dump list it); the fields above shape its
	// policy. nil: a Retry of its own, named "zds", logging to Log.
	Retry func(backoff.Policy) *backoff.Retry
}

// Client is the node proxy end of ZDS: it keeps a connection to the agent,
// reconnecting whenever it is lost, and receives a full snapshot on each
// connection.
type Client struct {
	cfg   ClientConfig
	log   *zap.Logger
	retry *backoff.Retry
}

// NewClient checks cfg and returns a Client; Run connects.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Path == "" {
		return nil, errors.New("zds: ClientConfig.Path is required")
	}
	if cfg.Handler == nil {
		return nil, errors.New("zds: ClientConfig.Handler is required")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	policy := backoff.Policy{Initial: cfg.MinBackoff, Max: cfg.MaxBackoff}
	retry := backoff.New("zds", policy, cfg.Log)
	if cfg.Retry != nil {
		retry = cfg.Retry(policy)
	}
	return &Client{cfg: cfg, log: cfg.Log, retry: retry}, nil
}

// Run connects to the agent and serves connection after connection until ctx
// is done; it then returns nil.
func (c *Client) Run(ctx context.Context) error {
	for {
		conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: c.cfg.Path, Net: "unixpacket"})
		if err == nil {
			_, err = c.serve(ctx, conn) // a served connection ended the streak
		}
		if ctx.Err() != nil {
			return nil
		}
		// The retry logs the streak's start and each backoff step.
		if c.retry.Wait(ctx, fmt.Errorf("agent connection on %s: %w", c.cfg.Path, err)) != nil {
			return nil
		}
	}
}

// serve runs one connection until it fails. served reports whether the
// agent sent anything (only then does the backoff start over, so an agent
// that hangs up on every hello is not hammered).
func (c *Client) serve(ctx context.Context, conn *net.UnixConn) (served bool, err error) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := writeMsg(conn, &zdsapi.ZdsHello{Version: zdsapi.Version_V1}); err != nil {
		return false, fmt.Errorf("zds: hello: %w", err)
	}
	c.log.Info("connected to the agent", zap.String("socket", c.cfg.Path))
	buf := make([]byte, MaxMessageSize)
	seen := map[string]bool{}
	for {
		n, fds, err := readMsg(conn, buf)
		var herr error
		switch {
		case errors.Is(err, ErrTruncated):
			herr = err // the message is lost; refuse it and go on
		case err != nil:
			return served, fmt.Errorf("zds: receive: %w", err)
		default:
			herr = c.handle(buf[:n], fds, seen)
		}
		if !served {
			c.retry.Succeeded()
		}
		served = true
		if herr != nil {
			c.log.Warn("refusing agent message", zap.Error(herr))
		}
		if err := writeMsg(conn, ack(herr)); err != nil {
			return true, fmt.Errorf("zds: ack: %w", err)
		}
	}
}

func ack(err error) *zdsapi.WorkloadResponse {
	a := &zdsapi.Ack{}
	if err != nil {
		a.Error = err.Error()
	}
	return &zdsapi.WorkloadResponse{Payload: &zdsapi.WorkloadResponse_Ack{Ack: a}}
}

// handle decodes one message and passes it on. It owns fds: each is closed
// or handed to the Handler.
func (c *Client) handle(b []byte, fds []int, seen map[string]bool) error {
	req, err := DecodeRequest(b)
	if err == nil {
		err = checkFDs(req, len(fds))
	}
	if err != nil {
		closeFDs(fds)
		return err
	}
	switch p := req.GetPayload().(type) {
	case *zdsapi.WorkloadRequest_Add:
		uid := p.Add.GetUid()
		seen[uid] = true
		ns, err := netns.FromFD(fds[0]) // owns the fd, also on error
		if err != nil {
			c.log.Debug("add carries a descriptor that is not a network namespace", zap.String("uid", uid), zap.Error(err))
			return fmt.Errorf("zds: add %s: %w", uid, err)
		}
		return c.cfg.Handler.Add(uid, p.Add.GetWorkloadInfo(), ns)
	case *zdsapi.WorkloadRequest_Keep:
		seen[p.Keep.GetUid()] = true
		return c.cfg.Handler.Keep(p.Keep.GetUid())
	case *zdsapi.WorkloadRequest_Del:
		return c.cfg.Handler.Del(p.Del.GetUid())
	case *zdsapi.WorkloadRequest_SnapshotSent:
		uids := make([]string, 0, len(seen))
		for u := range seen {
			uids = append(uids, u)
		}
		sort.Strings(uids)
		return c.cfg.Handler.SnapshotSent(uids)
	}
	return fmt.Errorf("%w: unhandled payload", ErrProtocol) // DecodeRequest rules this out
}
