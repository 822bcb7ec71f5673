package install

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Keep intervals.
const (
	// KeepResync re-checks the installation even without a change event
	// (a missed event, an edit inside a file kept open).
	KeepResync = 5 * time.Second
	// keepRetry spaces attempts after a failure (no primary config yet).
	keepRetry = time.Second
	// keepSettle lets a burst of writes to the conf dir finish before the
	// next check.
	keepSettle = 20 * time.Millisecond
)

// Keep installs the plugin (Install) and keeps it installed until ctx is
// done: it watches the conf dir (inotify) and re-checks on every change,
// and every KeepResync, so that when another writer rewrites the primary
// config (or writes a new, earlier-sorting one) our entry is back within
// milliseconds. It logs what it changed and failures (once per distinct
// error).
func Keep(ctx context.Context, cfg Config, log *zap.Logger) {
	var w *dirWatch
	defer func() { w.close() }()
	var lastErr string
	for {
		if w == nil {
			var err error
			if w, err = watchDir(cfg.ConfDir); err != nil {
				log.Debug("watching the CNI conf dir failed; re-checking periodically", zap.Error(err))
			}
		}
		res, err := Install(cfg)
		switch {
		case err != nil && err.Error() != lastErr:
			log.Warn("installing the CNI plugin failed; retrying", zap.Error(err))
		case err == nil && (res.BinaryChanged || res.ConfChanged):
			log.Info("CNI plugin installed", zap.String("conflist", res.Conflist),
				zap.Bool("binary_changed", res.BinaryChanged), zap.Bool("conflist_changed", res.ConfChanged))
		}
		lastErr = ""
		interval := KeepResync
		if err != nil {
			lastErr, interval = err.Error(), keepRetry
		}
		if !w.wait(ctx, interval) {
			w.close()
			w = nil
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// dirWatch is an inotify watch of one directory's entries.
type dirWatch struct{ fd int }

func watchDir(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("install: inotify: %w", err)
	}
	const mask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM |
		unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ATTRIB
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("install: watch %s: %w", dir, err)
	}
	return &dirWatch{fd: fd}, nil
}

// wait returns after a change event (plus keepSettle), after d, or when ctx
// is done. It reports false when the watch is broken (re-create it). A nil
// watch just sleeps.
func (w *dirWatch) wait(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return true
		}
		if w == nil {
			t := time.NewTimer(min(left, 250*time.Millisecond))
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(min(left, 250*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n == 0 {
			continue
		}
		time.Sleep(keepSettle)
		ok := w.drain()
		return ok
	}
}

// drain reads the pending events; false if the directory itself went away.
func (w *dirWatch) drain() bool {
	buf := make([]byte, 16<<10)
	ok := true
	for {
		n, err := unix.Read(w.fd, buf)
		if n <= 0 || err != nil {
			return ok
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
				ok = false
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

func (w *dirWatch) close() {
	if w != nil {
		unix.Close(w.fd)
	}
}
