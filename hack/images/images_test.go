package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var (
	buildsOnce sync.Once
	buildsRes  [2][]result
	buildsErr  error
	buildsDir  string
	testMeta   = meta{
		Version:  "0.0.0-test",
		Revision: "0123456789abcdef0123456789abcdef01234567",
		Source:   "https://github.com/ztunnel-go/ztunnel-go",
		Created:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildsDir != "" {
		os.RemoveAll(buildsDir)
	}
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// builds runs the whole builder twice (go build included) into two
// directories, once per test binary.
func builds(t *testing.T) [2][]result {
	t.Helper()
	buildsOnce.Do(func() {
		root := repoRoot(t)
		tmp, err := os.MkdirTemp("", "images-test-")
		if err != nil {
			buildsErr = err
			return
		}
		buildsDir = tmp
		for i := range buildsRes {
			buildsRes[i], err = build(options{
				Repo: root, Out: filepath.Join(tmp, []string{"a", "b"}[i]),
				Registry: "registry.test/ztg", Meta: testMeta,
			})
			if err != nil {
				buildsErr = err
				return
			}
		}
	})
	if buildsErr != nil {
		t.Fatalf("build: %v", buildsErr)
	}
	return buildsRes
}

func fileSHA(t *testing.T, p string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

func TestReproducible(t *testing.T) {
	b := builds(t)
	want := []string{"ztunnel", "ztunnel-cni", "ztunnel-cp", "zctl"}
	if _, err := os.Stat(filepath.Join(repoRoot(t), "cmd", "waypoint")); err == nil {
		want = append(want, "waypoint")
	}
	var got []string
	for i, r := range b[0] {
		got = append(got, r.Component)
		s := b[1][i]
		if r.Digest != s.Digest {
			t.Errorf("%s: two builds give digests %s and %s", r.Component, r.Digest, s.Digest)
		}
		if fileSHA(t, r.Archive) != fileSHA(t, s.Archive) {
			t.Errorf("%s: two builds give different archive bytes", r.Component)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("components %v, want %v", got, want)
	}
}

// imageFiles reads every layer's tar headers (and the contents, by path).
func imageFiles(t *testing.T, img v1.Image) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var names []string
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %d: %v", i, err)
			}
			if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(testMeta.Created) {
				t.Errorf("layer %d: %s: owner %d:%d mtime %v, want 0:0 %v", i, h.Name, h.Uid, h.Gid, h.ModTime, testMeta.Created)
			}
			names = append(names, h.Name)
			name := strings.TrimSuffix(h.Name, "/")
			hdrs[name] = h
			if h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				data[name] = b
			}
		}
		rc.Close()
		if !sort.StringsAreSorted(names) {
			t.Errorf("layer %d: entries not sorted", i)
		}
	}
	return hdrs, data
}

func TestImageConfig(t *testing.T) {
	for _, r := range builds(t)[0] {
		t.Run(r.Component, func(t *testing.T) {
			cf, err := r.Image.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(testMeta.Created) {
				t.Errorf("os/arch/created %s/%s/%v", cf.OS, cf.Architecture, cf.Created)
			}
			for k, v := range map[string]string{labelSource: testMeta.Source, labelVersion: testMeta.Version,
				labelRevision: testMeta.Revision, labelTitle: r.Component} {
				if cf.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
				}
			}
			root := r.Component == "ztunnel" || r.Component == "ztunnel-cni"
			if isRoot := strings.HasPrefix(cf.Config.User, "0:"); isRoot != root || cf.Config.User == "" {
				t.Errorf("user %q; root expected only for the node proxy and agent", cf.Config.User)
			}
			if r.Ref != "registry.test/ztg/"+r.Component+":"+testMeta.Version {
				t.Errorf("ref %s", r.Ref)
			}
			hdrs, data := imageFiles(t, r.Image)
			bin := "usr/local/bin/" + r.Component
			if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/"+bin || hdrs[bin] == nil || hdrs[bin].Mode&0o111 == 0 {
				t.Fatalf("entrypoint %v not an executable in the image", cf.Config.Entrypoint)
			}
			f, err := elf.NewFile(bytes.NewReader(data[bin]))
			if err != nil {
				t.Fatal(err)
			}
			if interp := f.Progs; len(interp) > 0 {
				for _, p := range interp {
					if p.Type == elf.PT_INTERP {
						t.Errorf("%s is dynamically linked", bin)
					}
				}
			}
			// Every binary reports the image's version, stamped at link time
			// as make build does: each prints it (-version; zctl version),
			// the proxies send it to the control plane, which zctl status
			// shows.
			exe := filepath.Join(t.TempDir(), r.Component)
			if err := os.WriteFile(exe, data[bin], 0o755); err != nil {
				t.Fatal(err)
			}
			arg := "-version"
			if r.Component == "zctl" {
				arg = "version"
			}
			if out, err := exec.Command(exe, arg).Output(); err != nil || string(out) != r.Component+" "+testMeta.Version+"\n" {
				t.Errorf("%s %s: %q (%v), want %q", bin, arg, out, err, r.Component+" "+testMeta.Version)
			}
			if _, ok := hdrs["usr/sbin/iptables-legacy"]; ok != (r.Component == "ztunnel-cni") {
				t.Errorf("iptables present = %v; only the agent carries the Debian userspace", ok)
			}
		})
	}
}

// TestArchiveFormats reads each archive as an OCI layout (what podman load
// and ctr images import read) and as a docker-save tarball (what crane push
// <file> reads), validates both, and pushes them to a registry.
func TestArchiveFormats(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	for _, r := range builds(t)[0] {
		t.Run(r.Component, func(t *testing.T) {
			dir := t.TempDir()
			untar(t, r.Archive, dir)
			idx, err := layout.ImageIndexFromPath(dir)
			if err != nil {
				t.Fatal(err)
			}
			im, err := idx.IndexManifest()
			if err != nil {
				t.Fatal(err)
			}
			if len(im.Manifests) != 1 || im.Manifests[0].Annotations[annotationRefName] != r.Ref ||
				im.Manifests[0].Annotations[annotationCtrdName] != r.Ref || im.Manifests[0].Digest != r.Digest {
				t.Fatalf("index %+v", im.Manifests)
			}
			img, err := idx.Image(r.Digest)
			if err != nil {
				t.Fatal(err)
			}
			if err := validate.Image(img); err != nil {
				t.Fatalf("OCI layout image: %v", err)
			}
			dimg, err := tarball.ImageFromPath(r.Archive, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := validate.Image(dimg); err != nil {
				t.Fatalf("docker-save image: %v", err)
			}
			ref := host + "/ztg/" + r.Component + ":" + testMeta.Version
			if err := crane.Push(img, ref, crane.Insecure); err != nil {
				t.Fatal(err)
			}
			if d, err := crane.Digest(ref, crane.Insecure); err != nil || d != r.Digest.String() {
				t.Errorf("pushed digest %s (%v), want %s", d, err, r.Digest)
			}
			if err := crane.Push(dimg, ref+"-docker", crane.Insecure); err != nil {
				t.Fatalf("push of the docker-save view: %v", err)
			}
		})
	}
}

func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	extract(t, f, dir)
}

// extract writes a tar stream (regular files, directories, symlinks) under dir.
func extract(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Name)))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode).Perm()|0o700)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
					err = os.WriteFile(p, b, os.FileMode(h.Mode).Perm())
				}
			}
		case tar.TypeSymlink:
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.Symlink(h.Linkname, p)
			}
		default:
			t.Fatalf("%s: tar type %q", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// resolve follows symlinks of the image's merged tree the way the kernel
// would inside it (absolute targets from the image root).
func resolve(hdrs map[string]*tar.Header, name string) (string, bool) {
	for range 40 {
		parts := strings.Split(name, "/")
		changed := false
		for i := 1; i <= len(parts); i++ {
			prefix := strings.Join(parts[:i], "/")
			h, ok := hdrs[prefix]
			if !ok {
				return "", false
			}
			if h.Typeflag == tar.TypeSymlink {
				target := h.Linkname
				if !strings.HasPrefix(target, "/") {
					target = path.Join(path.Dir(prefix), target)
				}
				name = strings.TrimPrefix(path.Clean("/"+path.Join(append([]string{target}, parts[i:]...)...)), "/")
				changed = true
				break
			}
		}
		if !changed {
			return name, true
		}
	}
	return "", false
}

// TestAgentUserspace checks the node agent's Debian layer: the binaries the
// agent runs, every shared library they need (DT_NEEDED, resolved in the
// image), the copyright file of every pinned package; as root, it runs them
// in a chroot of the image's filesystem, iptables-nft in a new network
// namespace against the kernel.
func TestAgentUserspace(t *testing.T) {
	var r result
	for _, x := range builds(t)[0] {
		if x.Component == "ztunnel-cni" {
			r = x
		}
	}
	hdrs, data := imageFiles(t, r.Image)
	lock, err := os.ReadFile("debian.lock")
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := parseLock(lock)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkgs {
		if _, ok := resolve(hdrs, "usr/share/doc/"+p.Name+"/copyright"); !ok {
			t.Errorf("no copyright file for %s", p.Name)
		}
	}
	for _, name := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables-restore",
		"iptables-legacy-save", "iptables-legacy-restore", "iptables-nft-save", "iptables-nft-restore",
		"ip6tables-legacy-restore", "ip6tables-nft-restore", "ipset"} {
		if _, ok := resolve(hdrs, "sbin/"+name); !ok {
			t.Errorf("no /sbin/%s", name)
		}
	}
	libDir := "usr/lib/x86_64-linux-gnu"
	checked := 0
	for name, b := range data {
		f, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			continue
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, lib := range libs {
			if _, ok := resolve(hdrs, libDir+"/"+lib); !ok {
				t.Errorf("%s needs %s, not in the image", name, lib)
			}
		}
		checked++
	}
	if checked < 20 {
		t.Errorf("only %d ELF files checked", checked)
	}
	if os.Geteuid() != 0 {
		t.Skip("running the binaries in a chroot needs root")
	}
	dir := t.TempDir()
	rc := mutate.Extract(r.Image)
	extract(t, rc, dir)
	rc.Close()
	run := func(args ...string) string {
		out, err := exec.Command("unshare", append([]string{"--net", "chroot", dir}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		return string(out)
	}
	for _, c := range [][]string{{"/sbin/iptables", "--version"}, {"/usr/sbin/iptables-legacy", "--version"},
		{"/usr/sbin/ip6tables-nft", "--version"}, {"/usr/sbin/ipset", "--version"}} {
		out := run(c...)
		if !regexp.MustCompile(`v[0-9]+\.[0-9]+`).MatchString(out) {
			t.Errorf("%v: %q", c, out)
		}
		t.Logf("chroot %v: %s", c, strings.TrimSpace(out))
	}
	if out := run("/usr/sbin/iptables-nft-restore", "--version"); !strings.Contains(out, "nf_tables") {
		t.Errorf("iptables-nft-restore --version: %q", out)
	}
	// A new chain and its listing in one fresh network namespace.
	out := run("/usr/sbin/xtables-nft-multi", "iptables-nft", "-t", "nat", "-N", "ZTG_IMAGE_TEST")
	if out != "" {
		t.Errorf("iptables-nft -N: %q", out)
	}
}

func TestParseLock(t *testing.T) {
	good := "# c\n\nlibc6 2.36-9 amd64 " + strings.Repeat("ab", 32) + "\n"
	pkgs, err := parseLock([]byte(good))
	if err != nil || len(pkgs) != 1 || pkgs[0].file() != "libc6_2.36-9_amd64.deb" {
		t.Fatalf("parseLock = %+v, %v", pkgs, err)
	}
	for _, bad := range []string{"", "# only\n", "libc6 2.36-9 amd64\n", "libc6 2.36-9 amd64 xyz\n",
		good + good} {
		if _, err := parseLock([]byte(bad)); err == nil {
			t.Errorf("parseLock(%q) accepted", bad)
		}
	}
	if got := (debPackage{Name: "x", Version: "1:2.0", Arch: "all"}).file(); got != "x_1%3a2.0_all.deb" {
		t.Errorf("file() = %s", got)
	}
}

func TestCheckDigestFailsClosed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.deb")
	if err := os.WriteFile(p, []byte("not the pinned package"), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("not the pinned package"))
	ok := debPackage{Name: "x", SHA256: hex.EncodeToString(sum[:])}
	if err := checkDigest(p, ok); err != nil {
		t.Errorf("matching digest refused: %v", err)
	}
	bad := ok
	bad.SHA256 = strings.Repeat("0", 64)
	if err := checkDigest(p, bad); err == nil || !strings.Contains(err.Error(), "pins") {
		t.Errorf("mismatching digest: %v", err)
	}
}

func TestMergedUsrAndDropped(t *testing.T) {
	for in, want := range map[string]string{"lib/x86_64-linux-gnu/libc.so.6": "usr/lib/x86_64-linux-gnu/libc.so.6",
		"lib64": "usr/lib64", "sbin/x": "usr/sbin/x", "usr/sbin/x": "usr/sbin/x", "etc/protocols": "etc/protocols",
		"library/x": "library/x"} {
		if got := mergedUsr(in); got != want {
			t.Errorf("mergedUsr(%s) = %s, want %s", in, got, want)
		}
	}
	for name, drop := range map[string]bool{"usr/share/doc/iptables/copyright": false, "usr/share/doc/iptables": false,
		"usr/share/doc/iptables/changelog.Debian.gz": true, "usr/share/man/man8/iptables.8.gz": true,
		"usr/lib/x86_64-linux-gnu/gconv/UTF-16.so": true, "usr/sbin/iptables-legacy": false} {
		if got := debDropped("iptables", name); got != drop {
			t.Errorf("debDropped(%s) = %v", name, got)
		}
	}
}

// TestVersionIsChartDefault: the images' tag (VERSION) is the chart's
// appVersion, which the chart uses when image.tag is empty.
func TestVersionIsChartDefault(t *testing.T) {
	root := repoRoot(t)
	m, err := readMeta(root)
	if err != nil {
		t.Fatal(err)
	}
	chart, err := os.ReadFile(filepath.Join(root, "deploy", "chart", "ztunnel-go", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	app := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(chart)
	if app == nil || string(app[1]) != m.Version {
		t.Errorf("VERSION %q, chart appVersion %q", m.Version, app)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}(-dirty)?$`).MatchString(m.Revision) || m.Created.IsZero() {
		t.Errorf("meta %+v", m)
	}
}
