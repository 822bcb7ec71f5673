// Package install puts the ztunnel-cni plugin on a node and takes it off
// again: it copies the binary into the CNI bin dir and adds the plugin's
// entry at the end of the primary conflist's plugin chain (the first
// *.conflist of the conf dir, by name, as runtimes pick it). Both steps are
// idempotent, and writes are atomic (temp file + rename), so a runtime never
// reads half a file.
//
// It does not decide when to uninstall (the agent's --keep-on-exit does:
// during an upgrade the plugin stays so new pods fail closed), and it does
// not convert single-plugin *.conf files.
package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// PluginType is the plugin's type (and binary name).
const PluginType = "ztunnel-cni"

// ErrNoConflist is returned (wrapped) when the conf dir has no *.conflist
// yet: the primary CNI has not written its configuration.
var ErrNoConflist = errors.New("no *.conflist in the CNI conf dir")

// Config says what to install where.
type Config struct {
	// BinDir is the CNI bin dir (/opt/cni/bin). Required.
	BinDir string
	// ConfDir is the CNI conf dir (/etc/cni/net.d). Required.
	ConfDir string
	// Binary is the plugin binary to copy; "" means this executable.
	Binary string
	// Plugin is the plugin's conflist entry; "type" is set to PluginType.
	Plugin map[string]any
}

// Result says what Install changed.
type Result struct {
	Conflist      string // the primary conflist
	BinaryChanged bool
	ConfChanged   bool
}

// Install copies the binary (if its content differs) and makes the primary
// conflist end with exactly one entry of ours, equal to cfg.Plugin.
func Install(cfg Config) (Result, error) {
	var res Result
	if cfg.BinDir == "" || cfg.ConfDir == "" {
		return res, errors.New("install: BinDir and ConfDir are required")
	}
	src := cfg.Binary
	if src == "" {
		var err error
		if src, err = os.Executable(); err != nil {
			return res, fmt.Errorf("install: own binary: %w", err)
		}
	}
	changed, err := copyBinary(src, filepath.Join(cfg.BinDir, PluginType))
	if err != nil {
		return res, err
	}
	res.BinaryChanged = changed
	path, err := PrimaryConflist(cfg.ConfDir)
	if err != nil {
		return res, err
	}
	res.Conflist = path
	entry := map[string]any{}
	for k, v := range cfg.Plugin {
		entry[k] = v
	}
	entry["type"] = PluginType
	res.ConfChanged, err = editConflist(path, func(plugins []any) []any {
		return append(withoutOurs(plugins), entry)
	})
	return res, err
}

// Uninstall removes our entry from every conflist in the conf dir and the
// binary from the bin dir. Missing pieces are not errors.
func Uninstall(cfg Config) error {
	lists, err := filepath.Glob(filepath.Join(cfg.ConfDir, "*.conflist"))
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	var errs []error
	for _, path := range lists {
		if _, err := editConflist(path, withoutOurs); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(filepath.Join(cfg.BinDir, PluginType)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("install: remove binary: %w", err))
	}
	return errors.Join(errs...)
}

// PrimaryConflist is the first *.conflist in dir by name.
func PrimaryConflist(dir string) (string, error) {
	lists, err := filepath.Glob(filepath.Join(dir, "*.conflist"))
	if err != nil {
		return "", fmt.Errorf("install: %w", err)
	}
	if len(lists) == 0 {
		return "", fmt.Errorf("install: %s: %w", dir, ErrNoConflist)
	}
	sort.Strings(lists)
	return lists[0], nil
}

func withoutOurs(plugins []any) []any {
	out := make([]any, 0, len(plugins))
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == PluginType {
			continue
		}
		out = append(out, p)
	}
	return out
}

// editConflist rewrites path's "plugins" through edit, writing only when
// the result differs. Other keys are kept (key order is normalised).
func editConflist(path string, edit func([]any) []any) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("install: %w", err)
	}
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		return false, fmt.Errorf("install: %s: %w", path, err)
	}
	plugins, ok := conf["plugins"].([]any)
	if !ok {
		return false, fmt.Errorf("install: %s: no \"plugins\" list", path)
	}
	before, _ := json.Marshal(plugins)
	conf["plugins"] = edit(plugins)
	after, _ := json.Marshal(conf["plugins"])
	if bytes.Equal(before, after) {
		return false, nil
	}
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return false, fmt.Errorf("install: %s: %w", path, err)
	}
	return true, writeAtomic(path, append(out, '\n'), 0o644)
}

func copyBinary(src, dst string) (bool, error) {
	in, err := os.ReadFile(src)
	if err != nil {
		return false, fmt.Errorf("install: read %s: %w", src, err)
	}
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, in) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return false, fmt.Errorf("install: %w", err)
	}
	return true, writeAtomic(dst, in, 0o755)
}

// writeAtomic writes data to a temp file beside path and renames it over
// path (a running binary or a conflist being read is never torn).
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	tmp := f.Name()
	_, err = io.Copy(f, bytes.NewReader(data))
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("install: write %s: %w", path, err)
	}
	return nil
}
