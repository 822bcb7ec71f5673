package testkit

import "time"

// Poll intervals of Eventually: the first check is immediate, then the wait
// between checks doubles from minPoll up to maxPoll, so a state that settles
// in microseconds is seen at once and a slow one (a condition that execs a
// command) is not checked in a busy loop.
const (
	minPoll = time.Millisecond
	maxPoll = 20 * time.Millisecond
)

// Eventually polls cond until it returns true and fails t (Fatalf) with
// "timed out after <timeout> waiting for <what>" when timeout passes first.
// It waits for an eventual state (a connection closed, a snapshot applied);
// the timeout only guards against hangs, so it asserts no timing: give it
// room for a loaded machine. cond runs on the calling goroutine (the last time
// at the deadline) and should not block for long.
func Eventually(t TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := minPoll; ; wait = min(2*wait, maxPoll) {
		if cond() {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
			return // a TB whose Fatalf returns
		}
		time.Sleep(min(wait, left))
	}
}

// EventuallyErr polls check until it returns nil, as Eventually does, and
// fails t with check's last error when timeout passes first.
// The error says what the test last saw, so a timeout reads
// "timed out after 5s waiting for the rotated roots: serving the old root"
// rather than only naming the wait.
func EventuallyErr(t TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	var last error
	deadline := time.Now().Add(timeout)
	for wait := minPoll; ; wait = min(2*wait, maxPoll) {
		if last = check(); last == nil {
			return
		}
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("timed out after %v waiting for %s: %v", timeout, what, last)
			return // a TB whose Fatalf returns
		}
		time.Sleep(min(wait, left))
	}
}
