package proxy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/node/rbac"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
)

// errRevoked ends a connection that a policy change no longer allows.
var errRevoked = errors.New("authorization policy changed: connection no longer allowed")

// errWorkloadGone ends a connection whose local workload left the snapshot:
// there is no policy left to hold it to, so it is not allowed (fail closed).
var errWorkloadGone = errors.New("the pod's workload left the control plane's snapshot; no policy applies")

// authorize evaluates conn against the policies of the local workload in
// snap and returns a ReasonPolicyDenied error naming the decision. What the
// dry-run and audit policies would have done is logged and counted, never
// enforced.
func (p *WorkloadProxy) authorize(snap *state.Snapshot, local *state.Workload, conn rbac.Conn) error {
	d := rbac.Evaluate(snap.PoliciesFor(local), conn)
	if v, ok := d.DryRun(); ok {
		p.log.Info("proxy: dry-run policy evaluated, not enforced",
			zap.String("policy", v.Policy), zap.String("would", verdict(v.Allowed)), zap.Bool("differs", v.Differs),
			zap.String("enforced", verdict(d.Allowed)), zap.Stringer("src", conn.SrcIP), zap.Uint16("dst_port", conn.DstPort),
			zap.Stringer("src_identity", conn.SrcIdentity))
		p.d.Metrics.dryRunDecision(v.Policy, verdict(v.Allowed))
	}
	if d.Audited != "" {
		p.log.Info("proxy: audit policy matched", zap.String("policy", d.Audited), zap.String("enforced", verdict(d.Allowed)),
			zap.Stringer("src", conn.SrcIP), zap.Uint16("dst_port", conn.DstPort), zap.Stringer("src_identity", conn.SrcIdentity))
		p.d.Metrics.dryRunDecision(d.Audited, "audit")
	}
	if d.Allowed {
		return nil
	}
	p.d.Metrics.denied(d.Policy)
	if d.Policy != "" {
		return WithReason(ReasonPolicyDenied, fmt.Errorf("%s by %s", d.Reason, d.Policy))
	}
	return WithReason(ReasonPolicyDenied, errors.New(d.Reason.String()))
}

// tracked is one open, authorized inbound connection of the pod.
type tracked struct {
	conn    rbac.Conn
	kill    func() // closes the connection; safe to call more than once
	revoked atomic.Bool
	// why says which policy decision revoked it, set before revoked.
	why atomic.Pointer[error]
}

// registry holds the pod's open inbound connections so that policy changes
// can be checked against them (ztunnel's PolicyWatcher).
type registry struct {
	mu    sync.Mutex
	conns shrinkSet[*tracked]
}

func (r *registry) add(t *tracked) {
	r.mu.Lock()
	r.conns.add(t)
	r.mu.Unlock()
}

func (r *registry) remove(t *tracked) {
	r.mu.Lock()
	r.conns.remove(t)
	r.mu.Unlock()
}

func (r *registry) snapshot() []*tracked {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*tracked, 0, r.conns.len())
	for t := range r.conns.all() {
		out = append(out, t)
	}
	return out
}

// track registers an authorized connection. If the snapshot moved on since
// authorization (authorizedWith), the connection is checked again at once,
// so a change that raced the handshake is not missed.
func (p *WorkloadProxy) track(t *tracked, authorizedWith *state.Snapshot) {
	p.inbound.add(t)
	if snap := p.d.Store.Load(); snap != authorizedWith {
		p.recheck(snap, []*tracked{t})
	}
}

// recheck closes the connections the policies of snap no longer allow.
func (p *WorkloadProxy) recheck(snap *state.Snapshot, conns []*tracked) {
	local := p.localIn(snap)
	if local == nil {
		// The workload left the snapshot: nothing says these connections
		// are allowed any more. The pod's removal over ZDS would drain
		// them, but it may never come (or come late): close them now.
		for _, t := range conns {
			p.revoke(snap, t, errWorkloadGone, "", "workload gone")
		}
		return
	}
	policies := snap.PoliciesFor(local)
	for _, t := range conns {
		d := rbac.Evaluate(policies, t.conn)
		if d.Allowed {
			continue
		}
		why := fmt.Errorf("%w: %s", errRevoked, d.Reason)
		if d.Policy != "" {
			why = fmt.Errorf("%w: %s by %s", errRevoked, d.Reason, d.Policy)
		}
		p.revoke(snap, t, why, d.Policy, d.Reason.String())
	}
}

// revoke closes t once, recording why (the first cause wins).
func (p *WorkloadProxy) revoke(snap *state.Snapshot, t *tracked, why error, policy, decision string) {
	t.why.CompareAndSwap(nil, &why)
	if t.revoked.CompareAndSwap(false, true) {
		p.log.Info("proxy: closing a connection that is no longer allowed",
			zap.Stringer("src", t.conn.SrcIP), zap.Uint16("dst_port", t.conn.DstPort),
			zap.Stringer("src_identity", t.conn.SrcIdentity), zap.Uint64("generation", snap.Generation),
			zap.String("policy", policy), zap.String("decision", decision))
		t.kill()
	}
}

// watchPolicies re-evaluates every open inbound connection of the pod on
// each snapshot swap until the proxy closes. It waits on the snapshot it
// last checked against, never on a fresh load: a swap that lands while a
// recheck runs (two pushes in a row, addresses then policies) must wake
// it again, or a DENY that arrived second would leave the connections it
// denies open.
func (p *WorkloadProxy) watchPolicies() {
	snap := p.d.Store.Load()
	for {
		select {
		case <-snap.Changed():
		case <-p.closedCh:
			return
		}
		snap = p.d.Store.Load()
		if conns := p.inbound.snapshot(); len(conns) > 0 {
			p.recheck(snap, conns)
		}
	}
}

// endErr is the error a finished inbound connection is recorded with:
// revoked beats forced beats what the copy returned.
func (t *tracked) endErr(err error, forced bool) error {
	switch {
	case t.revoked.Load():
		if why := t.why.Load(); why != nil {
			return WithReason(ReasonRevoked, *why)
		}
		return WithReason(ReasonRevoked, errRevoked)
	case forced:
		return ErrForced
	}
	return err
}
