package runtimecfg

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// errCRIDisabled: the containerd configuration disables its CRI plugin, so
// no kubelet uses that containerd (Docker's own containerd, for one).
var errCRIDisabled = errors.New("CRI plugin disabled")

// criPlugin is the CRI plugin's ID holding the cni table, by config
// version: 1 ("cri", containerd 1.x before version 2 configs), 2
// (containerd 1.5 to 2.x), 3 (containerd 2.x, where CNI moved to the
// runtime half of the split CRI plugin).
func criPlugin(version int64) string {
	switch version {
	case 2:
		return "io.containerd.grpc.v1.cri"
	case 3:
		return "io.containerd.cri.v1.runtime"
	}
	return "cri"
}

// criIDs are every name the CRI plugin (or its CNI-owning half) goes by in
// disabled_plugins.
var criIDs = []string{"cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"}

func defaultsContainerd(src string) Dirs {
	return Dirs{Runtime: Containerd, Source: src, BinDirs: []string{DefaultBinDir}, ConfDir: DefaultConfDir, Socket: defaultContainerdSocket}
}

// ContainerdConfig reads containerd's configuration file (a host path) and
// the files it imports, as containerd merges them: imports apply after the
// file that names them, in order (globs sorted, relative paths against the
// importing file's directory), and a plugin's section in a later file
// replaces the earlier section whole (containerd merges plugin sections,
// not their keys). Each file's plugin names follow its own version.
// A missing file is an os.ErrNotExist error.
func ContainerdConfig(o Options, file, src string) (Dirs, error) {
	d := defaultsContainerd(src)
	var (
		cni      map[string]any // the CRI plugin's cni table in force
		disabled []string
		seen     = map[string]bool{}
	)
	var load func(file string, top bool) error
	load = func(file string, top bool) error {
		if seen[file] {
			return nil
		}
		seen[file] = true
		m, err := readTOML(o.host(file))
		if err != nil {
			if top {
				return err
			}
			return fmt.Errorf("runtimecfg: containerd import %s: %w", file, err)
		}
		d.Files = append(d.Files, file)
		version, _ := m["version"].(int64)
		if plugin := table(m, "plugins", criPlugin(version)); plugin != nil {
			// The whole section replaces the earlier one: an import that
			// sets the CRI plugin without a cni table restores the defaults.
			cni = table(plugin, "cni")
			if cni == nil {
				cni = map[string]any{}
			}
		}
		disabled = append(disabled, strs(m, "disabled_plugins")...)
		if a := str(table(m, "grpc"), "address"); a != "" {
			d.Socket = a
		}
		for _, imp := range strs(m, "imports") {
			if !filepath.IsAbs(imp) {
				imp = filepath.Join(filepath.Dir(file), imp)
			}
			files, err := sortedGlob(o.host(imp))
			if err != nil {
				return fmt.Errorf("runtimecfg: containerd import %s in %s: %w", imp, file, err)
			}
			for _, f := range files {
				if o.Root != "" && o.Root != "/" {
					f = "/" + strings.TrimPrefix(strings.TrimPrefix(f, filepath.Clean(o.Root)), "/")
				}
				if err := load(f, false); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := load(file, true); err != nil {
		return Dirs{}, err
	}
	for _, id := range criIDs {
		if slices.Contains(disabled, id) {
			return Dirs{}, fmt.Errorf("runtimecfg: %s: %w (disabled_plugins has %q)", file, errCRIDisabled, id)
		}
	}
	// bin_dirs (containerd 2.1+) wins over the older single bin_dir.
	if dirs := strs(cni, "bin_dirs"); len(dirs) > 0 {
		d.BinDirs = dirs
	} else if dir := str(cni, "bin_dir"); dir != "" {
		d.BinDirs = []string{dir}
	}
	if dir := str(cni, "conf_dir"); dir != "" {
		d.ConfDir = dir
	}
	for i, b := range d.BinDirs {
		d.BinDirs[i] = cleanDir(b)
	}
	d.ConfDir = cleanDir(d.ConfDir)
	return d, nil
}
