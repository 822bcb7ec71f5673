// Package backoff is the one retry helper every loop in the tree uses:
// certificates, xDS, ZDS, JWKS, CRL and informer restarts. A Retry spaces
// attempts with capped, jittered exponential backoff, logs at most once per
// state change, and reports its state for the readiness page and the config
// dump through the Set that created it.
//
// The states are: healthy, and failing at backoff step k, where step k waits
// Initial·2^k before jitter and the last step is the one that reaches Max. A
// loop that keeps failing therefore logs one line per step until the cap,
// then nothing more until it recovers, whatever its attempt rate.
package backoff

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Policy shapes the wait between attempts.
type Policy struct {
	// Initial is the wait after the first failure; 0 means 100 ms.
	Initial time.Duration
	// Max caps the wait; 0 means 30 s. Below Initial it is raised to it.
	Max time.Duration
	// Jitter scales each wait by a random factor in [1-Jitter, 1+Jitter]
	// so that a fleet restarted together does not retry together. 0 means
	// 0.2; a negative value means none. The result never exceeds Max.
	Jitter float64
	// Healthy is how long a success must last to reset the backoff: a
	// failure sooner than that after a success continues the last streak's
	// steps, so a peer that accepts and then drops at once is not retried
	// at the shortest interval forever. 0: every success resets it.
	Healthy time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.Initial <= 0 {
		p.Initial = 100 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 30 * time.Second
	}
	p.Max = max(p.Max, p.Initial)
	if p.Jitter == 0 {
		p.Jitter = 0.2
	}
	p.Jitter = min(p.Jitter, 1) // negative stays negative: none, and idempotent
	return p
}

// step is the backoff step after failures consecutive failures (1 after the
// first): how many times Initial doubled, stopping at the step that reaches
// Max.
func (p Policy) step(failures int) int {
	k := 0
	for d := p.Initial; k < failures-1 && d < p.Max; k++ {
		d *= 2
	}
	return k
}

// Delay is the wait after failures consecutive failures, with r in [0, 1)
// choosing the point in the jitter range. Policy defaults apply.
func (p Policy) Delay(failures int, r float64) time.Duration {
	p = p.withDefaults()
	d := p.Initial << p.step(max(failures, 1))
	if d <= 0 || d > p.Max { // the shift overflowed or passed the cap
		d = p.Max
	}
	j := max(p.Jitter, 0)
	d = time.Duration(float64(d) * (1 - j + 2*j*r))
	return min(d, p.Max)
}

// Status is a Retry's state as the readiness page and config dump show it.
type Status struct {
	Name string `json:"name"`
	// Failing is true from a failure until the next success.
	Failing bool `json:"failing"`
	// Failures counts the consecutive failures of the current streak.
	Failures int `json:"failures,omitempty"`
	// Step is the backoff step of the streak (see the package comment).
	Step      int       `json:"step,omitempty"`
	LastError string    `json:"lastError,omitempty"`
	Since     time.Time `json:"since,omitzero"`       // the streak's first failure
	NextRetry time.Time `json:"nextRetry,omitzero"`   // when the next attempt is due
	Succeeded time.Time `json:"lastSuccess,omitzero"` // the last success, if any
}

// Retry is one retry loop's backoff and state. Its methods are safe for
// concurrent use; a nil *Retry is not usable, create one with New or
// Set.New.
type Retry struct {
	name string
	p    Policy
	log  *zap.Logger
	now  func() time.Time
	rnd  func() float64

	mu     sync.Mutex
	st     Status
	logged int // the step last logged, -1 when healthy
	prev   int // the failures of the streak the last success ended
}

// New returns a standalone Retry named name (the loop it paces, as it
// appears in logs and status) that logs to log (nil: no logs).
func New(name string, p Policy, log *zap.Logger) *Retry {
	if log == nil {
		log = zap.NewNop()
	}
	return &Retry{name: name, p: p.withDefaults(), log: log, now: time.Now, rnd: rand.Float64,
		st: Status{Name: name}, logged: -1}
}

// Name is the loop's name.
func (r *Retry) Name() string { return r.name }

// Failed records a failed attempt and returns the wait before the next one.
// It logs a warning when the streak starts and when it reaches a new step.
func (r *Retry) Failed(err error) time.Duration {
	now := r.now()
	r.mu.Lock()
	if !r.st.Failing {
		r.st.Failing, r.st.Failures, r.st.Since = true, 0, now
		if r.p.Healthy > 0 && now.Sub(r.st.Succeeded) < r.p.Healthy {
			r.st.Failures = r.prev // the success did not last
		}
	}
	r.st.Failures++
	r.st.Step = r.p.step(r.st.Failures)
	d := r.p.Delay(r.st.Failures, r.rnd())
	r.st.NextRetry = now.Add(d)
	r.st.LastError = ""
	if err != nil {
		r.st.LastError = err.Error()
	}
	st, log := r.st, r.logged != r.st.Step
	r.logged = r.st.Step
	r.mu.Unlock()
	if log {
		fields := []zap.Field{zap.String("loop", r.name), zap.Int("failures", st.Failures), zap.Duration("retry_in", d), zap.Error(err)}
		if st.Step == r.p.step(1<<30) {
			r.log.Warn(r.name+" failing; retrying at the longest interval, quiet until it recovers", fields...)
		} else {
			r.log.Warn(r.name+" failing; retrying", fields...)
		}
	}
	return d
}

// Wait records a failed attempt and sleeps until the next one is due. It
// returns ctx's error if ctx ends first.
func (r *Retry) Wait(ctx context.Context, err error) error {
	t := time.NewTimer(r.Failed(err))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Succeeded records a successful attempt: the streak ends, logged once at
// info level if there was one.
func (r *Retry) Succeeded() {
	now := r.now()
	r.mu.Lock()
	was := r.st
	r.st = Status{Name: r.name, Succeeded: now}
	r.logged, r.prev = -1, was.Failures
	r.mu.Unlock()
	if was.Failing {
		r.log.Info(r.name+" recovered", zap.String("loop", r.name), zap.Int("failures", was.Failures),
			zap.Duration("failing_for", now.Sub(was.Since)))
	}
}

// Status returns the loop's current state.
func (r *Retry) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st
}

// Set holds a daemon's Retries so that its readiness page and config dump
// list them all. The zero value is not usable; create one with NewSet.
type Set struct {
	log *zap.Logger
	mu  sync.Mutex
	all []*Retry
}

// NewSet returns an empty Set whose Retries log to log (nil: no logs).
func NewSet(log *zap.Logger) *Set { return &Set{log: log} }

// New returns a Retry named name that the Set reports. A nil Set returns a
// standalone Retry that logs nothing.
func (s *Set) New(name string, p Policy) *Retry {
	if s == nil {
		return New(name, p, nil)
	}
	r := New(name, p, s.log)
	s.mu.Lock()
	s.all = append(s.all, r)
	s.mu.Unlock()
	return r
}

// Status returns every Retry's state, sorted by name.
func (s *Set) Status() []Status {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	all := slices.Clone(s.all)
	s.mu.Unlock()
	out := make([]Status, 0, len(all))
	for _, r := range all {
		out = append(out, r.Status())
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Failing returns the states of the loops that are failing now, sorted by
// name.
func (s *Set) Failing() []Status {
	var out []Status
	for _, st := range s.Status() {
		if st.Failing {
			out = append(out, st)
		}
	}
	return out
}
