package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxFailures bounds the failures a counter keeps word of.
const maxFailures = 50

// counter is one probe's tally. A slow success (over -slow: a lost packet
// retransmitted, a DNS query retried) counts as Slow, not OK.
type counter struct {
	OK       int64    `json:"ok"`
	Fail     int64    `json:"fail"`
	Slow     int64    `json:"slow"`
	MaxMs    int64    `json:"max_ms"`
	Failures []string `json:"failures,omitempty"`
}

// loopStats is what /stats, /reset and /stop answer.
type loopStats struct {
	Since   time.Time `json:"since"`
	At      time.Time `json:"at"`
	Running bool      `json:"running"`
	Conn    counter   `json:"conn"`
	DNS     counter   `json:"dns"`
}

type looper struct {
	mu      sync.Mutex
	st      loopStats
	slow    time.Duration
	stop    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
}

func (l *looper) record(c func(*loopStats) *counter, what string, start time.Time, err error) {
	d := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	k := c(&l.st)
	k.MaxMs = max(k.MaxMs, d.Milliseconds())
	switch {
	case err != nil:
		k.Fail++
	case d > l.slow:
		k.Slow++
		err = fmt.Errorf("took %v (over -slow %v)", d.Round(time.Millisecond), l.slow)
	default:
		k.OK++
		return
	}
	msg := fmt.Sprintf("%s %s after %v: %v", start.UTC().Format(time.RFC3339Nano), what, d.Round(time.Millisecond), err)
	fmt.Println("testapp loop:", msg)
	if len(k.Failures) < maxFailures {
		k.Failures = append(k.Failures, msg)
	}
}

func (l *looper) snapshot(reset bool) loopStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.st
	st.At = time.Now()
	st.Conn.Failures = append([]string(nil), st.Conn.Failures...)
	st.DNS.Failures = append([]string(nil), st.DNS.Failures...)
	if reset {
		l.st = loopStats{Since: st.At, Running: st.Running}
	}
	return st
}

// run calls probe every interval until stopped.
func (l *looper) run(interval time.Duration, probe func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			probe()
			select {
			case <-l.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
}

// loop probes until /stop: a GET of -url on a new TCP connection each time
// (its body must hold -want), and a lookup of -lookup through the pod's
// resolv.conf; every error or slow answer is counted and logged. The test
// reads the tallies over the control address (loopback: not captured).
func loop(args []string) error {
	fs := flag.NewFlagSet("loop", flag.ContinueOnError)
	url := fs.String("url", "", "URL to GET on a new connection each time (empty: no connection probe)")
	want := fs.String("want", "", "text the GET's body must contain")
	host := fs.String("lookup", "", "host name to resolve each time (empty: no DNS probe)")
	interval := fs.Duration("interval", 50*time.Millisecond, "pause between two probes of a kind")
	timeout := fs.Duration("timeout", 3*time.Second, "bound of one probe")
	slow := fs.Duration("slow", 4*time.Second, "a success slower than this counts as slow")
	control := fs.String("control", "127.0.0.1:9090", "address of /stats, /reset and /stop")
	workers := fs.Int("workers", 1, "connection probes running at once")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" && *host == "" {
		return fmt.Errorf("loop: want -url or -lookup")
	}
	l := &looper{slow: *slow, stop: make(chan struct{}), st: loopStats{Since: time.Now(), Running: true}}
	if *url != "" {
		client := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		for range max(*workers, 1) {
			l.run(*interval, func() {
				start := time.Now()
				err := getOnce(client, *url, *want)
				l.record(func(s *loopStats) *counter { return &s.Conn }, "GET "+*url, start, err)
			})
		}
	}
	if *host != "" {
		r := &net.Resolver{PreferGo: true}
		l.run(*interval, func() {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), *timeout)
			addrs, err := r.LookupHost(ctx, *host)
			cancel()
			if err == nil && len(addrs) == 0 {
				err = fmt.Errorf("no addresses")
			}
			l.record(func(s *loopStats) *counter { return &s.DNS }, "lookup "+*host, start, err)
		})
	}
	answer := func(w http.ResponseWriter, st loopStats) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) { answer(w, l.snapshot(false)) })
	mux.HandleFunc("/reset", func(w http.ResponseWriter, r *http.Request) { answer(w, l.snapshot(true)) })
	mux.HandleFunc("/stop", func(w http.ResponseWriter, r *http.Request) {
		l.stopped.Do(func() {
			close(l.stop)
			l.wg.Wait() // the probes in flight are counted too
			l.mu.Lock()
			l.st.Running = false
			l.mu.Unlock()
		})
		answer(w, l.snapshot(false))
	})
	ln, err := net.Listen("tcp", *control)
	if err != nil {
		return fmt.Errorf("loop: control listener: %w", err)
	}
	fmt.Printf("testapp loop: control on %s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return fmt.Errorf("loop: control: %w", err)
	}
	return nil
}

func getOnce(c *http.Client, url, want string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	if !strings.Contains(string(body), want) {
		return fmt.Errorf("body %q lacks %q", body, want)
	}
	return nil
}
