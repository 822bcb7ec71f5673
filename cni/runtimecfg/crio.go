package runtimecfg

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// CRIOConfig reads CRI-O's configuration as CRI-O does: the main file
// (absent is fine: CRI-O runs on its defaults), then every file of the
// drop-in directory in lexical order, each key overriding the same key
// before it, then the command-line flags args (--cni-config-dir,
// --cni-plugin-dir, --listen), which override the files. file and dir are
// host paths.
func CRIOConfig(o Options, file, dir string, args []string, src string) (Dirs, error) {
	d := Dirs{Runtime: CRIO, Source: src, BinDirs: []string{DefaultBinDir}, ConfDir: DefaultConfDir, Socket: defaultCRIOSocket}
	files := []string{file}
	entries, err := os.ReadDir(o.host(dir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Dirs{}, fmt.Errorf("runtimecfg: CRI-O drop-in dir %s: %w", dir, err)
	}
	var dropins []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			dropins = append(dropins, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(dropins)
	for _, f := range append(files, dropins...) {
		m, err := readTOML(o.host(f))
		if errors.Is(err, os.ErrNotExist) && f == file {
			continue
		}
		if err != nil {
			return Dirs{}, fmt.Errorf("runtimecfg: CRI-O config %s: %w", f, err)
		}
		d.Files = append(d.Files, f)
		network := table(m, "crio", "network")
		if v := str(network, "network_dir"); v != "" {
			d.ConfDir = v
		}
		// plugin_dir is the single-directory spelling older releases read.
		if v := strs(network, "plugin_dirs"); len(v) > 0 {
			d.BinDirs = v
		} else if v := str(network, "plugin_dir"); v != "" {
			d.BinDirs = []string{v}
		}
		if v := str(table(m, "crio", "api"), "listen"); v != "" {
			d.Socket = v
		}
	}
	if v := flagValue(args, "cni-config-dir", ""); v != "" {
		d.ConfDir = v
	}
	if v := flagValues(args, "cni-plugin-dir", ""); len(v) > 0 {
		d.BinDirs = v
	}
	if v := flagValue(args, "listen", ""); v != "" {
		d.Socket = v
	}
	for i, b := range d.BinDirs {
		d.BinDirs[i] = cleanDir(b)
	}
	d.ConfDir = cleanDir(d.ConfDir)
	return d, nil
}

// cleanDir drops the trailing slash CRI-O's defaults carry
// ("/etc/cni/net.d/"), so equal directories compare equal.
func cleanDir(p string) string {
	if p == "" || p == "/" {
		return p
	}
	return strings.TrimRight(p, "/")
}
