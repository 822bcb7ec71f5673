package runtimecfg

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// write creates root/p with content (p a host path).
func write(t *testing.T, root, p, content string) {
	t.Helper()
	f := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeProc adds a process to the fake /proc under root.
func fakeProc(t *testing.T, root string, pid, comm, cwd string, args ...string) {
	t.Helper()
	write(t, root, "proc/"+pid+"/comm", comm+"\n")
	write(t, root, "proc/"+pid+"/cmdline", strings.Join(args, "\x00")+"\x00")
	if cwd != "" {
		if err := os.Symlink(cwd, filepath.Join(root, "proc", pid, "cwd")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestContainerdConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		bin     []string
		conf    string
		socket  string
		files2  []string // files read, after the main one
		wantErr string
	}{
		{
			name: "v2 (Debian's containerd 1.6)",
			files: map[string]string{"/etc/containerd/config.toml": `version = 2
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "/etc/cni/net.d"
`},
			bin: []string{"/usr/lib/cni"}, conf: "/etc/cni/net.d", socket: defaultContainerdSocket,
		},
		{
			name: "v1 short plugin name (k3s-style paths)",
			files: map[string]string{"/etc/containerd/config.toml": `
[plugins.cri.cni]
  bin_dir = "/var/lib/rancher/k3s/data/current/bin"
  conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"
`},
			bin: []string{"/var/lib/rancher/k3s/data/current/bin"}, conf: "/var/lib/rancher/k3s/agent/etc/cni/net.d", socket: defaultContainerdSocket,
		},
		{
			name: "v3 bin_dirs wins over bin_dir, socket from grpc",
			files: map[string]string{"/etc/containerd/config.toml": `version = 3
[grpc]
  address = "/run/k8s/containerd.sock"
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dir = "/old"
  bin_dirs = ["/opt/cni/bin", "/usr/libexec/cni/"]
  conf_dir = "/etc/cni/conf.d"
`},
			bin: []string{"/opt/cni/bin", "/usr/libexec/cni"}, conf: "/etc/cni/conf.d", socket: "/run/k8s/containerd.sock",
		},
		{
			name: "v2 section under a v3 file is not read",
			files: map[string]string{"/etc/containerd/config.toml": `version = 3
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/ignored"
`},
			bin: []string{DefaultBinDir}, conf: DefaultConfDir, socket: defaultContainerdSocket,
		},
		{
			name: "imports: relative glob, later section replaces the earlier whole",
			files: map[string]string{
				"/etc/containerd/config.toml": `version = 2
imports = ["conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/main/bin"
  conf_dir = "/main/net.d"
`,
				"/etc/containerd/conf.d/10-a.toml": `version = 2
[plugins."io.containerd.grpc.v1.cri".cni]
  conf_dir = "/a/net.d"
`,
				"/etc/containerd/conf.d/20-b.toml": `version = 2
[grpc]
  address = "/run/b.sock"
`,
			},
			// 10-a's section replaced main's whole: bin_dir back to the default.
			bin: []string{DefaultBinDir}, conf: "/a/net.d", socket: "/run/b.sock",
			files2: []string{"/etc/containerd/conf.d/10-a.toml", "/etc/containerd/conf.d/20-b.toml"},
		},
		{
			name: "CRI disabled (Docker's containerd)",
			files: map[string]string{"/etc/containerd/config.toml": `disabled_plugins = ["cri"]
`},
			wantErr: "CRI plugin disabled",
		},
		{
			name: "missing import",
			files: map[string]string{"/etc/containerd/config.toml": `version = 2
imports = ["/etc/containerd/absent.toml"]
`},
			wantErr: "import /etc/containerd/absent.toml",
		},
		{
			name:    "not TOML",
			files:   map[string]string{"/etc/containerd/config.toml": "version = = 2\n"},
			wantErr: "/etc/containerd/config.toml",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tc.files {
				write(t, root, p, c)
			}
			d, err := ContainerdConfig(Options{Root: root}, "/etc/containerd/config.toml", "test")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(d.BinDirs, tc.bin) || d.ConfDir != tc.conf || d.Socket != tc.socket {
				t.Errorf("got bin %v conf %s socket %s, want bin %v conf %s socket %s", d.BinDirs, d.ConfDir, d.Socket, tc.bin, tc.conf, tc.socket)
			}
			if want := append([]string{"/etc/containerd/config.toml"}, tc.files2...); !slices.Equal(d.Files, want) {
				t.Errorf("files read %v, want %v", d.Files, want)
			}
		})
	}
}

func TestCRIOConfig(t *testing.T) {
	root := t.TempDir()
	write(t, root, "/etc/crio/crio.conf", `[crio.network]
network_dir = "/etc/cni/net.d/"
plugin_dirs = ["/opt/cni/bin/", "/usr/libexec/cni/"]
[crio.api]
listen = "/var/run/crio/crio.sock"
`)
	write(t, root, "/etc/crio/crio.conf.d/10-net.conf", `[crio.network]
network_dir = "/etc/crio/net.d"
`)
	write(t, root, "/etc/crio/crio.conf.d/20-other.conf", `[crio.runtime]
log_level = "info"
`)
	d, err := CRIOConfig(Options{Root: root}, DefaultCRIOConfig, DefaultCRIOConfigDir, nil, "test")
	if err != nil {
		t.Fatal(err)
	}
	// The drop-in overrides network_dir alone; plugin_dirs stay the main file's.
	if d.ConfDir != "/etc/crio/net.d" || !slices.Equal(d.BinDirs, []string{"/opt/cni/bin", "/usr/libexec/cni"}) {
		t.Errorf("got %v", d)
	}
	if len(d.Files) != 3 {
		t.Errorf("files read %v, want the main file and both drop-ins", d.Files)
	}
	// Flags override the files.
	d, err = CRIOConfig(Options{Root: root}, DefaultCRIOConfig, DefaultCRIOConfigDir,
		[]string{"--cni-config-dir=/flag/net.d", "--cni-plugin-dir", "/flag/bin"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if d.ConfDir != "/flag/net.d" || !slices.Equal(d.BinDirs, []string{"/flag/bin"}) {
		t.Errorf("with flags got %v", d)
	}
	// No files at all: CRI-O's defaults.
	d, err = CRIOConfig(Options{Root: t.TempDir()}, DefaultCRIOConfig, DefaultCRIOConfigDir, nil, "test")
	if err != nil || d.ConfDir != DefaultConfDir || d.BinDir() != DefaultBinDir || len(d.Files) != 0 {
		t.Errorf("defaults: %v %v", d, err)
	}
}

func TestDetect(t *testing.T) {
	t.Run("process config wins over the conventional path", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, DefaultContainerdConfig, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nbin_dir = \"/usr/lib/cni\"\n")
		write(t, root, "/var/lib/node/containerd.toml", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nbin_dir = \"/var/lib/node/cni/bin\"\nconf_dir = \"/var/lib/node/cni/net.d\"\n")
		// Relative --config: resolved against the process's cwd.
		fakeProc(t, root, "4242", "containerd", "/var/lib/node", "containerd", "--config", "containerd.toml", "--log-level=warn")
		fakeProc(t, root, "4243", "containerd-shim", "", "containerd-shim-runc-v2", "-namespace", "k8s.io")
		fakeProc(t, root, "1", "init", "", "/sbin/init")
		d, err := Detect(Options{Root: root, Proc: filepath.Join(root, "proc")})
		if err != nil {
			t.Fatal(err)
		}
		if d.BinDir() != "/var/lib/node/cni/bin" || d.ConfDir != "/var/lib/node/cni/net.d" || !strings.HasPrefix(d.Source, "process 4242") {
			t.Errorf("got %v", d)
		}
	})
	t.Run("Docker's containerd is skipped", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/run/docker/containerd/containerd.toml", "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n")
		fakeProc(t, root, "10", "containerd", "/", "containerd", "--config", "/run/docker/containerd/containerd.toml")
		write(t, root, "/etc/crio/crio.conf", "[crio.network]\nnetwork_dir = \"/etc/crio/net.d\"\n")
		fakeProc(t, root, "11", "crio", "/", "crio")
		d, err := Detect(Options{Root: root, Proc: filepath.Join(root, "proc")})
		if err != nil {
			t.Fatal(err)
		}
		if d.Runtime != CRIO || d.ConfDir != "/etc/crio/net.d" {
			t.Errorf("got %v, want CRI-O's", d)
		}
	})
	t.Run("no process: conventional path", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, DefaultContainerdConfig, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nbin_dir = \"/usr/lib/cni\"\n")
		d, err := Detect(Options{Root: root, Proc: filepath.Join(root, "proc")})
		if err != nil {
			t.Fatal(err)
		}
		if d.BinDir() != "/usr/lib/cni" || d.ConfDir != DefaultConfDir || d.Source != "default path" {
			t.Errorf("got %v", d)
		}
	})
	t.Run("runtimes that disagree", func(t *testing.T) {
		root := t.TempDir()
		fakeProc(t, root, "10", "containerd", "/", "containerd")
		write(t, root, "/etc/crio/crio.conf", "[crio.network]\nnetwork_dir = \"/etc/crio/net.d\"\n")
		fakeProc(t, root, "11", "crio", "/", "crio")
		_, err := Detect(Options{Root: root, Proc: filepath.Join(root, "proc")})
		if err == nil || !strings.Contains(err.Error(), "disagree") || !strings.Contains(err.Error(), "/etc/crio/net.d") {
			t.Fatalf("err %v, want the disagreement named", err)
		}
	})
	t.Run("nothing found names what was tried", func(t *testing.T) {
		root := t.TempDir()
		_, err := Detect(Options{Root: root, Proc: filepath.Join(root, "proc")})
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), filepath.Join(root, DefaultContainerdConfig)) {
			t.Fatalf("err %v, want ErrNotFound naming %s", err, DefaultContainerdConfig)
		}
	})
}

func TestFlagValue(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "/a"}, "/a"},
		{[]string{"-c", "/a"}, "/a"},
		{[]string{"--config=/a", "-c=/b"}, "/b"},
		{[]string{"--log-level", "debug"}, ""},
		{[]string{"--", "--config", "/a"}, ""},
	} {
		if got := flagValue(tc.args, "config", "c"); got != tc.want {
			t.Errorf("flagValue(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}
