package crl

// Invariants of Manager:
//
//   - set is replaced whole (never mutated) and only by a reload whose file
//     parsed and whose every CRL verified against the roots of that moment;
//     a refused update leaves it as it was.
//   - Reloads are serialised by mu, which also guards the change detection
//     fields. No connection is closed and nothing is logged under wmu: a
//     sweep collects the revoked watchers under wmu and closes them after.
//   - A watcher is in watched from WatchPeer until its stop func runs or a
//     sweep revokes it; its revoke func runs at most once.

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
)

// DefaultPoll is how often Run looks at the CRL file and the roots.
const DefaultPoll = 5 * time.Second

// Config configures a Manager.
type Config struct {
	// Path is the CRL bundle (CRL_PATH). Required.
	Path string
	// Poll is Run's interval; 0 means DefaultPoll.
	Poll time.Duration
}

// Deps are the Manager's collaborators.
type Deps struct {
	// Roots returns the mesh trust roots the CRLs must be signed by, read
	// anew on every call (Run compares them to notice a rotation). Required.
	Roots func() ([]*x509.Certificate, error)
	// Log; nil means none.
	Log *zap.Logger
	// Registerer gets the CRL metrics; nil means none are exported.
	Registerer prometheus.Registerer
}

// Manager holds the CRLs in force and the established connections to close
// when a reload revokes their peer. Create it with New; it is safe for
// concurrent use.
type Manager struct {
	path  string
	poll  time.Duration
	roots func() ([]*x509.Certificate, error)
	log   *zap.Logger

	set      atomic.Pointer[Set]
	loadedAt atomic.Pointer[time.Time]

	mu        sync.Mutex       // serialises reloads; guards the fields below
	stamp     daemon.FileStamp // of the file at the last look
	rootsSum  [sha256.Size]byte
	refused   [sha256.Size]byte // file+roots sum last refused, not logged again
	lastErr   error
	lastErrAt time.Time

	wmu     sync.Mutex
	watched map[*watcher]struct{}

	rejections *prometheus.CounterVec // reporter, stage
	reloads    *prometheus.CounterVec // result
	serials    prometheus.Gauge
}

type watcher struct {
	chain   []*x509.Certificate
	peer    identity.Identity
	inbound bool
	revoke  func(error)
}

// New loads cfg.Path and verifies it against deps.Roots. The first load
// must succeed: a node proxy told to enforce CRLs does not start without
// them (there is no last good CRL to keep, and starting without one would
// admit the peers the operator revoked).
func New(cfg Config, deps Deps) (*Manager, error) {
	switch {
	case cfg.Path == "":
		return nil, errors.New("crl: Config.Path is required")
	case deps.Roots == nil:
		return nil, errors.New("crl: Deps.Roots is required")
	}
	m := &Manager{path: cfg.Path, poll: cfg.Poll, roots: deps.Roots, log: deps.Log, watched: make(map[*watcher]struct{})}
	if m.poll <= 0 {
		m.poll = DefaultPoll
	}
	if m.log == nil {
		m.log = zap.NewNop()
	}
	m.log = m.log.With(zap.String("path", cfg.Path))
	m.rejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "istio_crl_policy_rejections_total",
		Help: "Connections refused in the TLS handshake (stage=handshake) or closed (stage=established) because a peer certificate is revoked by a CRL.",
	}, []string{"reporter", "stage"})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ztunnel_crl_reloads_total",
		Help: "CRL bundle loads by result: success (swapped in) or failure (refused; the previous CRLs stay in force).",
	}, []string{"result"})
	m.serials = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ztunnel_crl_revoked_certificates", Help: "Serial numbers listed by the CRLs in force.",
	})
	if deps.Registerer != nil {
		for _, c := range []prometheus.Collector{m.rejections, m.reloads, m.serials} {
			if err := deps.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("crl: register metrics: %w", err)
			}
		}
	}
	if _, err := m.Reload(); err != nil {
		return nil, err
	}
	return m, nil
}

// Run looks at the file and the roots every Config.Poll until ctx is done
// and reloads when either changed; it always returns nil.
func (m *Manager) Run(ctx context.Context) error {
	t := time.NewTicker(m.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			_, _ = m.reloadIfChanged()
		}
	}
}

// reloadIfChanged reloads when the file's stamp or the roots changed.
func (m *Manager) reloadIfChanged() (bool, error) {
	fi, err := os.Stat(m.path)
	if err != nil {
		return m.Reload() // logs the error once, keeps the CRLs in force
	}
	roots, err := m.roots()
	if err != nil {
		return m.Reload()
	}
	m.mu.Lock()
	same := daemon.StampOf(fi) == m.stamp && sumCerts(roots) == m.rootsSum && m.lastErr == nil
	m.mu.Unlock()
	if same {
		return false, nil
	}
	return m.Reload()
}

// Reload reads the file and the roots now and, when the bundle parses and
// every CRL verifies, swaps it in and closes the watched connections it
// revokes. It reports whether a new Set went in force. On error the CRLs in
// force stay; the error is logged once per distinct file and roots.
func (m *Manager) Reload() (bool, error) {
	m.mu.Lock()
	set, err := m.loadLocked()
	if err != nil {
		m.lastErr, m.lastErrAt = err, time.Now()
	} else {
		m.lastErr = nil
	}
	m.mu.Unlock()
	if err != nil || set == nil {
		return false, err
	}
	m.sweep(set)
	return true, nil
}

// loadLocked returns the new Set, nil (and no error) when the content and
// roots are those in force.
func (m *Manager) loadLocked() (*Set, error) {
	first := m.set.Load() == nil
	fi, err := os.Stat(m.path)
	if err == nil {
		m.stamp = daemon.StampOf(fi)
	}
	raw, err := os.ReadFile(m.path)
	if err != nil {
		return nil, m.refuse(first, [sha256.Size]byte{1}, fmt.Errorf("crl: read the CRL file: %w", err))
	}
	roots, err := m.roots()
	if err != nil {
		return nil, m.refuse(first, [sha256.Size]byte{2}, fmt.Errorf("crl: %w", err))
	}
	rootsSum := sumCerts(roots)
	m.rootsSum = rootsSum
	fileSum := sha256.Sum256(raw)
	both := sha256.Sum256(append(fileSum[:], rootsSum[:]...))
	if cur := m.set.Load(); cur != nil && cur.Sum == both {
		return nil, nil
	}
	lists, err := parse(raw)
	if err == nil {
		var s *Set
		if s, err = verify(lists, roots); err == nil {
			s.Sum = both
			m.set.Store(s)
			now := time.Now()
			m.loadedAt.Store(&now)
			m.refused = [sha256.Size]byte{}
			m.reloads.WithLabelValues("success").Inc()
			n := 0
			for _, in := range s.Infos() {
				n += in.Revoked
				if in.IssuerKind == "intermediate" {
					m.log.Info("CRL issuer is no mesh trust root: held as an intermediate CA's CRL, checked against that CA's certificate in each peer chain that presents it",
						zap.String("issuer", in.Issuer))
				}
				if !in.NextUpdate.IsZero() && now.After(in.NextUpdate) {
					m.log.Warn("CRL is past its nextUpdate; its revocations stay in force until a newer CRL is loaded",
						zap.String("issuer", in.Issuer), zap.Time("next_update", in.NextUpdate))
				}
			}
			m.serials.Set(float64(n))
			m.log.Info("CRLs loaded", zap.Int("crls", s.Len()), zap.Int("revoked_certificates", n), zap.Int("roots", len(roots)))
			return s, nil
		}
	}
	err = fmt.Errorf("crl: %s: %w", m.path, err)
	return nil, m.refuse(first, both, err)
}

// refuse counts and logs a refused load, once per distinct content and
// error (a file that stays broken is not logged every poll), and returns
// err. The first load's error is not logged: New returns it.
func (m *Manager) refuse(first bool, sum [sha256.Size]byte, err error) error {
	repeat := sum == m.refused && m.lastErr != nil && m.lastErr.Error() == err.Error()
	m.refused = sum
	if !repeat {
		m.reloads.WithLabelValues("failure").Inc()
		if !first {
			m.log.Error("CRL update refused; the CRLs in force stay", zap.Error(err))
		}
	}
	return err
}

func sumCerts(cs []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	for _, c := range cs {
		h.Write(c.Raw)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// sweep closes every watched connection s revokes.
func (m *Manager) sweep(s *Set) {
	type hit struct {
		w   *watcher
		err *RevokedError
	}
	var hits []hit
	m.wmu.Lock()
	for w := range m.watched {
		if re := s.Revoked(w.chain); re != nil {
			delete(m.watched, w)
			hits = append(hits, hit{w, re})
		}
	}
	m.wmu.Unlock()
	for _, h := range hits {
		m.closeRevoked(h.w, h.err)
	}
}

func (m *Manager) closeRevoked(w *watcher, re *RevokedError) {
	m.rejections.WithLabelValues(reporter(w.inbound), "established").Inc()
	m.log.Warn("closing connection: peer certificate revoked by CRL",
		zap.String("direction", direction(w.inbound)), zap.Stringer("peer", w.peer),
		zap.String("serial", SerialHex(re.Serial)), zap.String("subject", re.Subject),
		zap.Int("chain_position", re.Position), zap.String("crl_issuer", re.Issuer))
	w.revoke(re)
}

func reporter(inbound bool) string {
	if inbound {
		return "destination"
	}
	return "source"
}

func direction(inbound bool) string {
	if inbound {
		return "inbound"
	}
	return "outbound"
}

var _ hbone.Revocation = (*Manager)(nil)

// Set returns the CRLs in force.
func (m *Manager) Set() *Set { return m.set.Load() }

// CheckPeer refuses a peer chain (leaf first, as presented) that holds a
// revoked certificate: the error is a *RevokedError. inbound: the peer is
// a client of our HBONE server; else it is the server we dialled. It is
// called in every HBONE handshake: one atomic load and a map lookup per
// certificate.
func (m *Manager) CheckPeer(chain []*x509.Certificate, inbound bool) error {
	re := m.set.Load().Revoked(chain)
	if re == nil {
		return nil
	}
	m.rejections.WithLabelValues(reporter(inbound), "handshake").Inc()
	return re
}

// WatchPeer registers an established connection: revoke is called once,
// from the reloading goroutine, with a *RevokedError, when a later reload
// revokes a certificate of chain. stop deregisters it (call it when the
// connection ends). A reload that raced the handshake is caught: the
// chain is checked again after it is registered.
func (m *Manager) WatchPeer(chain []*x509.Certificate, peer identity.Identity, inbound bool, revoke func(error)) (stop func()) {
	w := &watcher{chain: chain, peer: peer, inbound: inbound, revoke: revoke}
	m.wmu.Lock()
	m.watched[w] = struct{}{}
	m.wmu.Unlock()
	stop = func() {
		m.wmu.Lock()
		delete(m.watched, w)
		m.wmu.Unlock()
	}
	if re := m.set.Load().Revoked(chain); re != nil {
		m.wmu.Lock()
		_, still := m.watched[w]
		delete(m.watched, w)
		m.wmu.Unlock()
		if still {
			m.closeRevoked(w, re)
		}
	}
	return stop
}

// Watched is the number of connections registered now.
func (m *Manager) Watched() int {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	return len(m.watched)
}

// Dump is the manager's config dump section.
type Dump struct {
	Path       string    `json:"path"`
	LoadedAt   time.Time `json:"loadedAt,omitzero"`
	CRLs       []Info    `json:"crls"`
	LastError  string    `json:"lastError,omitempty"`
	LastErrAt  time.Time `json:"lastErrorAt,omitzero"`
	Watched    int       `json:"watchedConnections"`
	PollPeriod string    `json:"pollPeriod"`
}

// Dump reports the CRLs in force and the last refused update.
func (m *Manager) Dump() Dump {
	d := Dump{Path: m.path, CRLs: m.set.Load().Infos(), Watched: m.Watched(), PollPeriod: m.poll.String()}
	if d.CRLs == nil {
		d.CRLs = []Info{}
	}
	if t := m.loadedAt.Load(); t != nil {
		d.LoadedAt = *t
	}
	m.mu.Lock()
	if m.lastErr != nil {
		d.LastError, d.LastErrAt = m.lastErr.Error(), m.lastErrAt
	}
	m.mu.Unlock()
	return d
}
