package hbone

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// conn is one HTTP/2 connection over an established TLS connection, client
// or server side. It carries CONNECT streams only, so it is much smaller
// than a general HTTP/2 stack: no server push, no priorities, no request
// bodies other than the tunnel bytes.
//
// Goroutines: one read loop per connection; nothing per stream. Frame
// writes happen on the caller's goroutine under wmu. The keepalive check
// runs on a timer.
//
// Locks: wmu (frame writes, hpack encoder) may be taken before mu, never
// after it. mu guards every field marked so below and every Tunnel field
// marked "under c.mu".
type conn struct {
	nc  net.Conn
	raw *rawConn // the socket under nc's TLS, for write batching; nil in tests
	// over is the stream under nc's TLS when it is not a socket (the outer
	// tunnel of double HBONE); nil otherwise.
	over net.Conn
	// singleUse closes the connection when its last stream ends (the inner
	// connection of double HBONE carries one CONNECT and is not pooled).
	singleUse bool
	client    bool
	cfg       H2Settings
	// advMaxStreams is the SETTINGS_MAX_CONCURRENT_STREAMS we advertise
	// (server); 0 means not advertised.
	advMaxStreams uint32
	// maxHeaderList bounds a decoded header list.
	maxHeaderList uint32
	peer          identity.Identity // verified TLS peer identity
	ctx           context.Context   // cancelled when the connection ends
	cancel        context.CancelFunc

	// hooks, set before start, called without locks held.
	onStream  func(t *Tunnel, fields []hpack.HeaderField) // server: a new request stream
	onRefused func(total int)                             // server: a stream refused for the limit
	onClose   func(err error)                             // the connection ended

	// Read loop only.
	hdec       *hpack.Decoder
	fields     []hpack.HeaderField
	fieldsSize uint32
	fieldsBig  bool
	hdr        [frameHeaderLen]byte
	rbuf       []byte
	cont       headerBlock
	sawFrame   bool
	refused    int
	readActive atomic.Bool // a frame was read since the last keepalive check

	wmu  sync.Mutex
	henc *hpack.Encoder
	hbuf bytes.Buffer

	mu             sync.Mutex
	streams        map[uint32]*Tunnel // under mu
	nextID         uint32             // under mu; client: next stream id to open
	lastPeerStream uint32             // under mu; server: highest stream id the client opened
	active         int                // under mu; client: streams reserved or open; server: handlers running
	peerMaxFrame   uint32             // under mu
	peerInitWindow int64              // under mu
	peerMaxStreams uint32             // under mu
	sendWin        int64              // under mu; connection send window
	sendWinCh      chan struct{}      // under mu; closed and replaced when sendWin grows
	recvWin        int64              // under mu; what the peer may still send
	recvUnacked    int64              // under mu; consumed bytes not yet returned with WINDOW_UPDATE
	closing        bool               // under mu; no new streams (GOAWAY either way, idle expiry)
	sentGoAway     bool               // under mu
	closed         bool               // under mu
	closeErr       error              // under mu
	pingOut        bool               // under mu; a keepalive PING awaits its ACK
	pingSent       time.Time          // under mu
	pingSeq        uint64             // under mu
	done           chan struct{}      // closed when the connection ends
	ready          chan struct{}      // closed when the peer's first SETTINGS arrived
	ka             *time.Timer
	idleTimeout    time.Duration // client: close after this long without streams; 0: never
	idleSince      time.Time     // under mu
	idleTimer      *time.Timer   // under mu
	idleArmed      bool          // under mu
}

type headerBlock struct {
	sid       uint32
	endStream bool
	buf       []byte
}

func newConn(nc net.Conn, client bool, cfg H2Settings, peer identity.Identity, parent context.Context) *conn {
	c := &conn{
		nc:             nc,
		client:         client,
		cfg:            cfg.withDefaults(),
		peer:           peer,
		streams:        make(map[uint32]*Tunnel),
		nextID:         1,
		peerMaxFrame:   minFrameSize,
		peerInitWindow: defaultWindow,
		peerMaxStreams: ^uint32(0),
		sendWin:        defaultWindow,
		sendWinCh:      make(chan struct{}),
		recvWin:        defaultWindow,
		done:           make(chan struct{}),
		ready:          make(chan struct{}),
		maxHeaderList:  16 << 10,
	}
	c.ctx, c.cancel = context.WithCancel(parent)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.hdec = hpack.NewDecoder(4096, c.emitField)
	return c
}

// start writes the connection preface and settings and starts the read
// loop and keepalive. The caller sets hooks and limits before.
func (c *conn) start() error {
	c.hdec.SetMaxStringLength(int(c.maxHeaderList))
	settings := make([]setting, 0, 5)
	settings = append(settings,
		setting{http2.SettingInitialWindowSize, c.cfg.StreamWindow},
		setting{http2.SettingMaxFrameSize, c.cfg.MaxFrameSize},
		setting{http2.SettingMaxHeaderListSize, c.maxHeaderList},
	)
	if c.client {
		settings = append(settings, setting{http2.SettingEnablePush, 0})
	}
	if c.advMaxStreams > 0 {
		settings = append(settings, setting{http2.SettingMaxConcurrentStreams, c.advMaxStreams})
	}
	var b []byte
	if c.client {
		b = append(b, clientPreface...)
	}
	b = appendSettings(b, settings)
	if inc := int64(c.cfg.ConnWindow) - defaultWindow; inc > 0 {
		b = appendWindowUpdate(b, 0, uint32(inc))
		c.recvWin += inc
	}
	c.wmu.Lock()
	err := c.writeLocked(b)
	c.wmu.Unlock()
	if err != nil {
		c.fail(err)
		return err
	}
	go c.readLoop()
	if c.cfg.KeepaliveInterval > 0 {
		c.mu.Lock()
		c.ka = time.AfterFunc(c.cfg.KeepaliveInterval, c.keepalive)
		c.mu.Unlock()
	}
	return nil
}
