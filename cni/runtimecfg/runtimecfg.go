// Package runtimecfg reads where a node's container runtime looks for CNI
// plugins and their configuration, from the runtime's own configuration:
// containerd's CRI plugin section (bin_dir/bin_dirs and conf_dir, config
// versions 1 to 3, with imports) and CRI-O's [crio.network] (network_dir,
// plugin_dirs, crio.conf plus the crio.conf.d drop-ins, and the command-line
// flags that override them). The node agent installs its chained plugin
// where this says, and zctl precheck reports the same answer, so the two
// cannot disagree about a node.
//
// The runtime's configuration is found from the running runtime first (its
// process's --config flag in /proc), because distributions that move the
// CNI directories (k3s, RKE2, microk8s, this repository's test node) also
// move the configuration file; the conventional paths are the fallback.
// It only reads.
package runtimecfg

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// Runtime names.
const (
	Containerd = "containerd"
	CRIO       = "cri-o"
)

// Conventional locations and the runtimes' built-in defaults.
const (
	DefaultContainerdConfig = "/etc/containerd/config.toml"
	DefaultCRIOConfig       = "/etc/crio/crio.conf"
	DefaultCRIOConfigDir    = "/etc/crio/crio.conf.d"
	DefaultBinDir           = "/opt/cni/bin"
	DefaultConfDir          = "/etc/cni/net.d"
	defaultContainerdSocket = "/run/containerd/containerd.sock"
	defaultCRIOSocket       = "/var/run/crio/crio.sock"
)

// ErrNotFound is returned (wrapped) when no container runtime configuration
// was found at all; the message names every place that was looked at.
var ErrNotFound = errors.New("no container runtime configuration found")

// Dirs are the CNI directories one container runtime uses. Paths are the
// host's (not prefixed with Options.Root).
type Dirs struct {
	// Runtime is Containerd or CRIO.
	Runtime string `json:"runtime"`
	// Source says how the configuration was found: the runtime's process
	// and its flags, or a conventional path.
	Source string `json:"source"`
	// Files are the configuration files read, in the order they apply.
	// Empty when the runtime runs on its built-in defaults.
	Files []string `json:"files,omitempty"`
	// BinDirs are the directories searched for plugin binaries, in order;
	// a plugin installed into the first is found.
	BinDirs []string `json:"binDirs"`
	// ConfDir holds the network configuration (*.conf, *.conflist, *.json).
	ConfDir string `json:"confDir"`
	// Socket is the runtime's CRI socket (what crictl and the kubelet
	// dial; ctr -a for containerd).
	Socket string `json:"socket,omitempty"`
}

// BinDir is the directory a plugin is installed into: the first searched.
func (d Dirs) BinDir() string {
	if len(d.BinDirs) == 0 {
		return ""
	}
	return d.BinDirs[0]
}

func (d Dirs) String() string {
	files := "built-in defaults"
	if len(d.Files) > 0 {
		files = strings.Join(d.Files, ", ")
	}
	return fmt.Sprintf("%s (%s; %s): CNI bin dir %s, conf dir %s", d.Runtime, d.Source, files, strings.Join(d.BinDirs, ":"), d.ConfDir)
}

// Options say where to look.
type Options struct {
	// Root is where the host's filesystem is visible ("" means "/": the
	// caller runs on the host). Every path read is prefixed with it.
	Root string
	// Proc is the host's process table, read for running runtimes (a pod
	// needs hostPID). "" means "/proc"; a directory that does not exist
	// means no process is visible.
	Proc string
}

func (o Options) host(p string) string {
	if o.Root == "" || o.Root == "/" {
		return p
	}
	return filepath.Join(o.Root, p)
}

// Detect finds the CNI directories of the node's container runtime: from
// each running containerd or CRI-O process's own configuration, else from
// the conventional configuration paths. Several runtimes that agree count
// as one; runtimes that disagree are an error naming each, as is finding
// none, since a guess would install the plugin where nothing runs it.
func Detect(o Options) (Dirs, error) {
	found, tried, err := fromProcesses(o)
	if err != nil {
		return Dirs{}, err
	}
	if len(found) == 0 {
		tried = append(tried, "no containerd or crio process in "+o.procDir())
		switch d, err := ContainerdConfig(o, DefaultContainerdConfig, "default path"); {
		case err == nil:
			found = append(found, d)
		case errors.Is(err, errCRIDisabled):
			tried = append(tried, err.Error())
		case errors.Is(err, os.ErrNotExist):
			tried = append(tried, o.host(DefaultContainerdConfig)+": not found")
		default:
			return Dirs{}, err
		}
		if _, err := os.Stat(o.host(DefaultCRIOConfig)); err == nil || dirHasFiles(o.host(DefaultCRIOConfigDir)) {
			d, err := CRIOConfig(o, DefaultCRIOConfig, DefaultCRIOConfigDir, nil, "default path")
			if err != nil {
				return Dirs{}, err
			}
			found = append(found, d)
		} else {
			tried = append(tried, o.host(DefaultCRIOConfig)+" and "+o.host(DefaultCRIOConfigDir)+": not found")
		}
	}
	switch {
	case len(found) == 0:
		return Dirs{}, fmt.Errorf("runtimecfg: %w (%s)", ErrNotFound, strings.Join(tried, "; "))
	case len(found) > 1:
		for _, d := range found[1:] {
			if !slices.Equal(d.BinDirs, found[0].BinDirs) || d.ConfDir != found[0].ConfDir {
				var all []string
				for _, d := range found {
					all = append(all, d.String())
				}
				return Dirs{}, fmt.Errorf("runtimecfg: container runtimes disagree on the CNI directories: %s", strings.Join(all, "; "))
			}
		}
	}
	return found[0], nil
}

func (o Options) procDir() string {
	if o.Proc == "" {
		return "/proc"
	}
	return o.Proc
}

// fromProcesses reads the configuration of every running containerd and
// crio. A containerd whose CRI plugin is disabled (Docker's own) is no
// Kubernetes runtime and is skipped.
func fromProcesses(o Options) (found []Dirs, tried []string, err error) {
	proc := o.procDir()
	entries, rerr := os.ReadDir(proc)
	if rerr != nil {
		return nil, []string{proc + ": " + rerr.Error()}, nil
	}
	for _, e := range entries {
		pid, perr := strconv.Atoi(e.Name())
		if perr != nil {
			continue
		}
		comm, rerr := os.ReadFile(filepath.Join(proc, e.Name(), "comm"))
		if rerr != nil {
			continue // gone, or not ours to read
		}
		name := strings.TrimSpace(string(comm))
		if name != "containerd" && name != "crio" {
			continue
		}
		raw, rerr := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if rerr != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		cwd, _ := os.Readlink(filepath.Join(proc, e.Name(), "cwd"))
		abs := func(p string) string {
			if p == "" || path.IsAbs(p) || cwd == "" {
				return p
			}
			return path.Join(cwd, p)
		}
		src := fmt.Sprintf("process %d: %s", pid, strings.Join(args, " "))
		var d Dirs
		switch name {
		case "containerd":
			if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
				continue // a subcommand (containerd config dump, ...), not the daemon
			}
			cfg := flagValue(args[1:], "config", "c")
			explicit := cfg != ""
			if !explicit {
				cfg = DefaultContainerdConfig
			}
			d, err = ContainerdConfig(o, abs(cfg), src)
			if errors.Is(err, os.ErrNotExist) && !explicit {
				// containerd runs on its defaults without a config file.
				d, err = defaultsContainerd(src), nil
			}
			if errors.Is(err, errCRIDisabled) {
				tried = append(tried, src+": CRI plugin disabled")
				err = nil
				continue
			}
		case "crio":
			cfg := flagValue(args[1:], "config", "c")
			if cfg == "" {
				cfg = DefaultCRIOConfig
			}
			dir := flagValue(args[1:], "config-dir", "d")
			if dir == "" {
				dir = DefaultCRIOConfigDir
			}
			d, err = CRIOConfig(o, abs(cfg), abs(dir), args[1:], src)
		}
		if err != nil {
			return nil, nil, err
		}
		found = append(found, d)
	}
	return found, tried, nil
}

// flagValue returns the last value of --long/-short in Go flag or
// urfave/cli syntax (-x v, -x=v, --x v, --x=v); "" if absent.
func flagValue(args []string, long, short string) string {
	vals := flagValues(args, long, short)
	if len(vals) == 0 {
		return ""
	}
	return vals[len(vals)-1]
}

func flagValues(args []string, long, short string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		for _, n := range []string{long, short} {
			if n == "" {
				continue
			}
			for _, p := range []string{"--" + n, "-" + n} {
				switch {
				case a == p && i+1 < len(args):
					out = append(out, args[i+1])
					i++
				case strings.HasPrefix(a, p+"="):
					out = append(out, strings.TrimPrefix(a, p+"="))
				default:
					continue
				}
				goto next
			}
		}
	next:
	}
	return out
}

func dirHasFiles(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			return true
		}
	}
	return false
}

// readTOML decodes one file into a generic map.
func readTOML(file string) (map[string]any, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := toml.NewDecoder(bytes.NewReader(data)).Decode(&m); err != nil {
		return nil, fmt.Errorf("runtimecfg: %s: %w", file, err)
	}
	return m, nil
}

func table(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

func strs(m map[string]any, key string) []string {
	list, _ := m[key].([]any)
	var out []string
	for _, v := range list {
		if s, ok := v.(string); ok && s != "" {
			out = append(out, s)
		}
	}
	return out
}

// sortedGlob expands pattern the way containerd expands an import (a
// literal path stays, even if it does not exist yet: the read reports it).
func sortedGlob(pattern string) ([]string, error) {
	if !strings.ContainsAny(pattern, "*?[") {
		return []string{pattern}, nil
	}
	m, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	sort.Strings(m)
	return m, nil
}
