package install

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// afterAttempt, when set by a test, runs between an attempt and the start
// of the directory watch: the window a concurrent rewrite can fall into.
var afterAttempt func()

// Keep installs the plugin (Install) and keeps it installed until ctx is
// done; see Keeper.Run.
func Keep(ctx context.Context, cfg Config, log *zap.Logger) {
	NewKeeper(cfg, nil).Run(ctx, log)
}

// Resolver says where to install: the bin and conf dirs as the installer
// reaches them, and where they came from (named in every failure, e.g.
// "containerd's /etc/containerd/config.toml"). An error is why they are
// not known (the runtime's config unreadable or ambiguous).
type Resolver func() (binDir, confDir, from string, err error)

// Keeper installs the plugin and keeps it installed, and reports whether
// it is: a node agent is not ready while the plugin is not both copied and
// chained into the runtime's primary config, because the chain is what
// captures new pods.
type Keeper struct {
	cfg     Config
	resolve Resolver

	mu   sync.Mutex
	err  error  // nil once installed
	used Config // the dirs of the last attempt
}

// ErrNotYet is Installed's answer before the first attempt.
var ErrNotYet = errors.New("install: the CNI plugin is not installed yet")

// NewKeeper returns a Keeper of cfg's plugin. resolve, if non-nil, is asked
// for the directories before every attempt (so a runtime reconfigured and
// restarted is followed); nil means cfg.BinDir and cfg.ConfDir.
func NewKeeper(cfg Config, resolve Resolver) *Keeper {
	return &Keeper{cfg: cfg, resolve: resolve, err: ErrNotYet, used: cfg}
}

// Installed is nil while the plugin is installed and chained, else why not
// (naming the directories and where they came from).
func (k *Keeper) Installed() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Config is cfg with the directories of the last attempt (what an
// uninstall must clean).
func (k *Keeper) Config() Config {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.used
}

// attempt resolves the directories and installs once.
func (k *Keeper) attempt() (Config, Result, error) {
	cfg := k.cfg
	var res Result
	var err error
	if k.resolve != nil {
		var from string
		cfg.BinDir, cfg.ConfDir, from, err = k.resolve()
		if err == nil {
			res, err = Install(cfg)
			if err != nil {
				err = fmt.Errorf("%w (CNI bin dir %s and conf dir %s from %s)", err, cfg.BinDir, cfg.ConfDir, from)
			}
		}
	} else {
		res, err = Install(cfg)
	}
	k.mu.Lock()
	k.err = err
	if err == nil || cfg.ConfDir != "" {
		k.used = cfg
	}
	k.mu.Unlock()
	return cfg, res, err
}

// Run installs the plugin and keeps it installed until ctx is done: it
// watches the conf dir (inotify) and re-checks on every change, and every
// KeepResync, so that when another writer rewrites the primary config (or
// writes a new, earlier-sorting one) our entry is back within
// milliseconds. It logs what it changed and failures (once per distinct
// error).
func (k *Keeper) Run(ctx context.Context, log *zap.Logger) {
	var (
		w       *dirWatch
		watched string
	)
	defer func() { w.close() }()
	var lastErr string
	for first := true; ; first = false {
		cfg, res, err := k.attempt()
		if afterAttempt != nil {
			afterAttempt()
		}
		if w != nil && watched != cfg.ConfDir {
			w.close()
			w = nil
		}
		fresh := false
		if w == nil && cfg.ConfDir != "" {
			var werr error
			if w, werr = watchDir(cfg.ConfDir); werr != nil {
				log.Debug("watching the CNI conf dir failed; re-checking periodically", zap.Error(werr))
			}
			watched, fresh = cfg.ConfDir, w != nil
		}
		switch {
		case err != nil && err.Error() != lastErr:
			log.Error("installing the CNI plugin failed; not ready until it succeeds, retrying", zap.Error(err))
		case err == nil && (first || res.BinaryChanged || res.ConfChanged || lastErr != ""):
			log.Info("CNI plugin installed", zap.String("conflist", res.Conflist), zap.String("bin_dir", cfg.BinDir),
				zap.Bool("binary_changed", res.BinaryChanged), zap.Bool("conflist_changed", res.ConfChanged))
		}
		lastErr = ""
		interval := KeepResync
		if err != nil {
			lastErr, interval = err.Error(), keepRetry
		}
		if fresh {
			// The watch began after this attempt read the directory: a
			// rewrite in between raised no event, so look once more now.
			continue
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
