// Package install puts the ztunnel-cni plugin on a node and takes it off
// again: it copies the binary into the CNI bin dir and adds the plugin's
// entry at the end of the plugin chain of the primary config, the file the
// container runtime uses (the lexically first *.conf, *.conflist or *.json
// of the conf dir that parses, as libcni-based runtimes pick it). A
// single-plugin config is converted into a conflist of that plugin and
// ours (written as <name>.conflist, the original removed), as Istio does.
// Both steps are idempotent, and writes are atomic (temp file + rename), so
// a runtime never reads half a file. Keep re-applies them whenever the conf
// dir changes (another writer, e.g. the primary CNI's agent, rewrote it).
//
// It does not decide when to uninstall (the agent does: during an upgrade
// the plugin stays so new ambient pods fail closed).
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
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// PluginType is the plugin's type (and binary name).
const PluginType = "ztunnel-cni"

// ErrNoConflist is returned (wrapped) when the conf dir has no CNI config
// (*.conf, *.conflist, *.json) yet: the primary CNI has not written it.
var ErrNoConflist = errors.New("no CNI config (*.conf, *.conflist, *.json) in the CNI conf dir")

// configExts are the extensions runtimes load, in libcni's terms.
var configExts = []string{".conf", ".conflist", ".json"}

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
	path, err := PrimaryConfig(cfg.ConfDir)
	if err != nil {
		return res, err
	}
	entry := map[string]any{}
	for k, v := range cfg.Plugin {
		entry[k] = v
	}
	entry["type"] = PluginType
	edit := func(plugins []any) []any { return append(withoutOurs(plugins), entry) }
	// One read decides: a runtime rewriting the file in place (truncate,
	// then write) showed a first read empty and a second one a list, and
	// a list converted as if it were one plugin replaced the runtime's
	// conflist and then removed it.
	data, err := os.ReadFile(path)
	if err != nil {
		return res, fmt.Errorf("install: %w", err)
	}
	switch isList, ok := confKind(data); {
	case !ok:
		return res, fmt.Errorf("install: %s is no longer a CNI config (being rewritten?)", path)
	case !isList:
		res.Conflist, err = convertConf(path, data, edit)
		res.ConfChanged = err == nil
		return res, err
	}
	res.Conflist = path
	res.ConfChanged, err = editConflist(path, edit)
	return res, err
}

// convertConf turns the single-plugin config data, read from path, into a
// conflist <name>.conflist holding that plugin, then edit's additions, and
// removes path unless that is the list's own name. The list takes the
// plugin's cniVersion and name.
func convertConf(path string, data []byte, edit func([]any) []any) (string, error) {
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		return "", fmt.Errorf("install: %s: %w", path, err)
	}
	list := map[string]any{"cniVersion": conf["cniVersion"], "name": conf["name"]}
	plugin := map[string]any{}
	for k, v := range conf {
		if k != "cniVersion" && k != "name" {
			plugin[k] = v
		}
	}
	list["plugins"] = edit([]any{plugin})
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return "", fmt.Errorf("install: %s: %w", path, err)
	}
	dst := strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
	if err := writeAtomic(dst, append(out, '\n'), 0o644); err != nil {
		return "", err
	}
	if dst == path { // a single plugin in a .conflist file: rewritten in place
		return dst, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("install: remove %s after converting it to %s: %w", path, dst, err)
	}
	return dst, nil
}

// isConflist reports whether path holds a config list (a "plugins" key),
// and whether it parses as a CNI config at all.
func isConflist(path string) (list, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, false
	}
	return confKind(data)
}

// confKind is isConflist on a file's bytes.
func confKind(data []byte) (list, ok bool) {
	var conf map[string]json.RawMessage
	if json.Unmarshal(data, &conf) != nil {
		return false, false
	}
	if _, has := conf["plugins"]; has {
		return true, true
	}
	_, has := conf["type"]
	return false, has
}

// Uninstall removes our entry from every config list in the conf dir and
// the binary from the bin dir. Missing pieces are not errors.
func Uninstall(cfg Config) error {
	files, err := configFiles(cfg.ConfDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, path := range files {
		if list, _ := isConflist(path); !list {
			continue
		}
		if _, err := editConflist(path, withoutOurs); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(filepath.Join(cfg.BinDir, PluginType)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("install: remove binary: %w", err))
	}
	return errors.Join(errs...)
}

// PrimaryConfig is the config file the runtime uses: the lexically first
// *.conf, *.conflist or *.json in dir that parses as a CNI config (a list
// with "plugins" or a single plugin with "type"); runtimes skip the others.
func PrimaryConfig(dir string) (string, error) {
	files, err := configFiles(dir)
	if err != nil {
		return "", err
	}
	for _, f := range files {
		if _, ok := isConflist(f); ok {
			return f, nil
		}
	}
	return "", fmt.Errorf("install: %s: %w", dir, ErrNoConflist)
}

// configFiles are dir's config files, sorted by name.
func configFiles(dir string) ([]string, error) {
	var files []string
	for _, ext := range configExts {
		m, err := filepath.Glob(filepath.Join(dir, "*"+ext))
		if err != nil {
			return nil, fmt.Errorf("install: %w", err)
		}
		for _, f := range m {
			if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() {
				files = append(files, f)
			}
		}
	}
	sort.Strings(files)
	return files, nil
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

// binaryChecks remembers, per destination, the stamps of the source and
// the destination when they were last found equal or the copy was written.
// The Keeper looks every KeepResync: comparing two 50 MB binaries byte for
// byte each time cost a node agent about a tenth of a core and 100 MB of
// garbage every five seconds, where two stats tell that nothing changed.
var binaryChecks = struct {
	sync.Mutex
	m map[string][2]daemon.FileStamp
}{m: map[string][2]daemon.FileStamp{}}

// binaryCompares counts byte-for-byte comparisons (tests).
var binaryCompares atomic.Int64

func copyBinary(src, dst string) (bool, error) {
	srcStamp, err := daemon.StatStamp(src)
	if err != nil {
		return false, fmt.Errorf("install: read %s: %w", src, err)
	}
	dstStamp, dstErr := daemon.StatStamp(dst)
	binaryChecks.Lock()
	last, seen := binaryChecks.m[dst]
	binaryChecks.Unlock()
	if dstErr == nil && seen && last == [2]daemon.FileStamp{srcStamp, dstStamp} {
		return false, nil
	}
	if dstErr == nil {
		binaryCompares.Add(1)
		same, err := sameContent(src, dst)
		if err != nil {
			return false, err
		}
		if same {
			rememberBinary(dst, srcStamp)
			return false, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return false, fmt.Errorf("install: %w", err)
	}
	in, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("install: read %s: %w", src, err)
	}
	defer in.Close()
	if err := writeAtomicFrom(dst, in, 0o755); err != nil {
		return false, err
	}
	rememberBinary(dst, srcStamp)
	return true, nil
}

// rememberBinary records dst as equal to the source of srcStamp.
func rememberBinary(dst string, srcStamp daemon.FileStamp) {
	dstStamp, err := daemon.StatStamp(dst)
	binaryChecks.Lock()
	defer binaryChecks.Unlock()
	if err != nil {
		delete(binaryChecks.m, dst)
		return
	}
	binaryChecks.m[dst] = [2]daemon.FileStamp{srcStamp, dstStamp}
}

// sameContent compares two files in chunks, without holding either whole.
// An unreadable destination counts as different (it is rewritten).
func sameContent(src, dst string) (bool, error) {
	a, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("install: read %s: %w", src, err)
	}
	defer a.Close()
	b, err := os.Open(dst)
	if err != nil {
		return false, nil
	}
	defer b.Close()
	ai, err := a.Stat()
	if err != nil {
		return false, fmt.Errorf("install: read %s: %w", src, err)
	}
	if bi, err := b.Stat(); err != nil || bi.Size() != ai.Size() {
		return false, nil
	}
	const chunk = 256 << 10
	abuf, bbuf := make([]byte, chunk), make([]byte, chunk)
	for {
		an, aerr := io.ReadFull(a, abuf)
		bn, berr := io.ReadFull(b, bbuf)
		if an != bn || !bytes.Equal(abuf[:an], bbuf[:bn]) {
			return false, nil
		}
		switch {
		case aerr == io.EOF || aerr == io.ErrUnexpectedEOF:
			return berr == io.EOF || berr == io.ErrUnexpectedEOF, nil
		case aerr != nil:
			return false, fmt.Errorf("install: read %s: %w", src, aerr)
		case berr != nil:
			return false, nil
		}
	}
}

// writeAtomic writes data to a temp file beside path and renames it over
// path (a running binary or a conflist being read is never torn).
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	return writeAtomicFrom(path, bytes.NewReader(data), mode)
}

// writeAtomicFrom is writeAtomic with the content read from r.
func writeAtomicFrom(path string, r io.Reader, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	tmp := f.Name()
	_, err = io.Copy(f, r)
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
