// Package local is the local-mode cluster source: a directory of ordinary
// Kubernetes YAML (multi-document files, *.yaml, *.yml, *.json), read at start
// and watched for changes. A bad document is reported with its file, document
// index and field, and never wipes the good state: the objects that file held
// before stay until the document is fixed or the file is removed.
//
// It is not a Kubernetes client; see the cluster package for the interface it
// implements.
package local

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// DefaultInterval is how often the directory is checked for changes.
const DefaultInterval = 200 * time.Millisecond

type fileState struct {
	sum [32]byte
	// stamp is the file's when it was read: an unchanged stamp skips the
	// read and the hash (the directory is looked at five times a second).
	stamp daemon.FileStamp
	items []cluster.Item
	// origins: item key → document index (see Origin).
	origins map[string]int
}

// Source watches one directory. Create it with New.
type Source struct {
	dir      string
	log      *zap.Logger
	interval time.Duration

	mu      sync.Mutex
	files   map[string]*fileState
	cur     *cluster.Objects
	changed chan struct{}
	errs    []error
	// perFileErrs keeps each file's decode errors so an unchanged bad file
	// keeps being reported.
	perFileErrs map[string][]error
}

// New returns a source for dir. log may be nil (no logging); interval <= 0
// means DefaultInterval.
func New(dir string, log *zap.Logger, interval time.Duration) *Source {
	if log == nil {
		log = zap.NewNop()
	}
	if interval <= 0 {
		interval = DefaultInterval
	}
	return &Source{dir: dir, log: log, interval: interval, files: map[string]*fileState{}, changed: make(chan struct{})}
}

// Current implements cluster.Source.
func (s *Source) Current() (*cluster.Objects, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.changed
}

// Errors returns the problems found by the last read, one per bad document
// or unreadable file.
func (s *Source) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// Run implements cluster.Source: it reads the directory, then re-reads it
// every interval until ctx is done.
func (s *Source) Run(ctx context.Context) error {
	if _, err := s.Load(); err != nil {
		return err
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := s.Load(); err != nil {
				s.log.Warn("local config directory unreadable; keeping the last good state", zap.String("dir", s.dir), zap.Error(err))
			}
		}
	}
}

// Load reads the directory once, publishes a new object set if anything
// changed, and reports whether it did. Errors about single documents are
// logged and kept in Errors; only an unreadable directory is returned.
func (s *Source) Load() (bool, error) {
	paths, err := s.list()
	if err != nil {
		return false, fmt.Errorf("local: read %s: %w", s.dir, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.cur == nil
	var errs []error
	seen := map[string]bool{}
	for _, p := range paths {
		seen[p] = true
		old := s.files[p]
		stamp, err := daemon.StatStamp(p)
		if err == nil && old != nil && old.stamp == stamp {
			errs = append(errs, s.fileErrs(p)...)
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue // keep what the file held before
		}
		sum := sha256.Sum256(data)
		if old != nil && old.sum == sum {
			old.stamp = stamp
			errs = append(errs, s.fileErrs(p)...)
			continue
		}
		var objs cluster.Objects
		derrs := cluster.Decode(p, data, &objs)
		items := objs.Items()
		var fatal []error
		for _, e := range derrs {
			if errors.Is(e, cluster.ErrUnsupportedKind) {
				s.log.Info("skipping unsupported object", zap.Error(e))
				continue
			}
			fatal = append(fatal, e)
		}
		if len(fatal) > 0 && old != nil {
			// Keep the file's previous objects that no good document replaces:
			// one of them is probably what the bad document describes.
			have := map[string]bool{}
			for _, it := range items {
				have[it.Key] = true
			}
			for _, it := range old.items {
				if !have[it.Key] {
					items = append(items, it)
				}
			}
		}
		for _, e := range fatal {
			s.log.Error("bad object in local config; keeping the last good state for it", zap.Error(e))
		}
		s.files[p] = &fileState{sum: sum, stamp: stamp, items: items, origins: originsOf(p, data)}
		s.setFileErrs(p, fatal)
		errs = append(errs, fatal...)
		changed = true
	}
	for p := range s.files {
		if !seen[p] {
			delete(s.files, p)
			s.setFileErrs(p, nil)
			changed = true
		}
	}
	s.errs = errs
	if !changed {
		return false, nil
	}
	s.publish()
	return true, nil
}

func (s *Source) fileErrs(p string) []error {
	if s.perFileErrs == nil {
		return nil
	}
	return s.perFileErrs[p]
}

func (s *Source) setFileErrs(p string, errs []error) {
	if s.perFileErrs == nil {
		s.perFileErrs = map[string][]error{}
	}
	if len(errs) == 0 {
		delete(s.perFileErrs, p)
		return
	}
	s.perFileErrs[p] = errs
}

func (s *Source) publish() {
	var paths []string
	for p := range s.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	objs := &cluster.Objects{}
	seen := map[string]string{}
	for _, p := range paths {
		for _, it := range s.files[p].items {
			if prev, dup := seen[it.Key]; dup {
				s.log.Warn("object defined twice; the first file wins", zap.String("object", it.Key), zap.String("first", prev), zap.String("ignored", p))
				continue
			}
			seen[it.Key] = p
			objs.Add(it.Obj)
		}
	}
	objs.Sort()
	s.cur = objs
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Source) list() ([]string, error) {
	var out []string
	err := filepath.WalkDir(s.dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != s.dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml", ".json":
			if !strings.HasPrefix(d.Name(), ".") {
				out = append(out, path)
			}
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}
