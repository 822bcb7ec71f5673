package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// debPackage is one pinned Debian package of debian.lock.
type debPackage struct {
	Name, Version, Arch, SHA256 string
}

// file is the .deb's name as apt-get download writes it (the epoch's colon
// escaped as %3a).
func (p debPackage) file() string {
	return fmt.Sprintf("%s_%s_%s.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"), p.Arch)
}

// parseLock reads debian.lock: "name version arch sha256" lines, # comments.
func parseLock(data []byte) ([]debPackage, error) {
	var pkgs []debPackage
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("debian.lock:%d: want \"name version arch sha256\", got %q", n, line)
		}
		if b, err := hex.DecodeString(f[3]); err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("debian.lock:%d: %s: sha256 %q is not 64 hex digits", n, f[0], f[3])
		}
		if seen[f[0]] {
			return nil, fmt.Errorf("debian.lock:%d: %s listed twice", n, f[0])
		}
		seen[f[0]] = true
		pkgs = append(pkgs, debPackage{Name: f[0], Version: f[1], Arch: f[2], SHA256: strings.ToLower(f[3])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("debian.lock: %w", err)
	}
	if len(pkgs) == 0 {
		return nil, errors.New("debian.lock: no packages")
	}
	return pkgs, nil
}

// fetchDebs makes sure every package's .deb is in cacheDir with the pinned
// digest, downloading the missing ones with `apt-get download name=version`.
// A download that fails is retried once after `apt-get update` when running
// as root (a fresh machine has no package lists). It returns each package's
// .deb path, in lock order.
func fetchDebs(pkgs []debPackage, cacheDir string, logf func(string, ...any)) ([]string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("debian cache: %w", err)
	}
	paths := make([]string, len(pkgs))
	var missing []debPackage
	for i, p := range pkgs {
		paths[i] = filepath.Join(cacheDir, p.file())
		if err := checkDigest(paths[i], p); err != nil {
			os.Remove(paths[i])
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return paths, nil
	}
	args := []string{"download"}
	for _, p := range missing {
		args = append(args, p.Name+":"+p.Arch+"="+p.Version)
	}
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", args...)
		cmd.Dir = cacheDir
		return cmd.CombinedOutput()
	}
	logf("apt-get %s", strings.Join(args, " "))
	out, err := download()
	if err != nil && os.Geteuid() == 0 {
		logf("apt-get download failed; running apt-get update once")
		if upd, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return nil, fmt.Errorf("apt-get update: %w: %s", uerr, upd)
		}
		out, err = download()
	}
	if err != nil {
		return nil, fmt.Errorf("apt-get download (a pinned version may be retired; see debian.lock): %w: %s", err, out)
	}
	for _, p := range missing {
		if err := checkDigest(filepath.Join(cacheDir, p.file()), p); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// checkDigest fails unless the file at path has the package's pinned SHA-256.
func checkDigest(path string, p debPackage) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != p.SHA256 {
		return fmt.Errorf("%s %s: sha256 %s, debian.lock pins %s", p.Name, p.Version, got, p.SHA256)
	}
	return nil
}

// debDropped lists what the image leaves out of a package: documentation
// other than the copyright file, translations, man pages, lintian overrides,
// and glibc's iconv modules (nothing the agent runs converts charsets).
func debDropped(pkg, name string) bool {
	for _, prefix := range []string{"usr/share/man/", "usr/share/info/", "usr/share/locale/",
		"usr/share/lintian/", "usr/lib/x86_64-linux-gnu/gconv/"} {
		if strings.HasPrefix(name+"/", prefix) {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(name, "usr/share/doc/"); ok {
		// Keep the directory itself and the copyright file (a symlink to
		// another package's directory is kept too: dpkg ships some docs so).
		return rest != pkg && rest != pkg+"/copyright"
	}
	return false
}

// mergedUsr rewrites a path of the root filesystem to Debian's merged-/usr
// layout (bin, sbin, lib, lib64 are symlinks into usr), so libraries that
// packages put in /lib and in /usr/lib end up in one directory the dynamic
// loader searches.
func mergedUsr(name string) string {
	for _, top := range []string{"bin", "sbin", "lib", "lib64"} {
		if name == top || strings.HasPrefix(name, top+"/") {
			return "usr/" + name
		}
	}
	return name
}

// addDeb adds a package's files (as `dpkg-deb --fsys-tarfile` lists them) to
// the tree, in the merged-/usr layout, minus what debDropped leaves out.
func addDeb(t *tree, p debPackage, debPath string) error {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", debPath)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("dpkg-deb %s: %w", p.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb %s: %w", p.Name, err)
	}
	addErr := addTarStream(t, p.Name, stdout)
	if addErr != nil {
		io.Copy(io.Discard, stdout)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", debPath, err, stderr.String())
	}
	return addErr
}

func addTarStream(t *tree, pkg string, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: data tar: %w", pkg, err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name == "" || debDropped(pkg, name) {
			continue
		}
		name = mergedUsr(name)
		mode := h.FileInfo().Mode().Perm() | h.FileInfo().Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := t.dir(name, mode); err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", pkg, name, err)
			}
			if err := t.file(name, mode, data); err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
		case tar.TypeSymlink:
			if err := t.symlink(name, h.Linkname); err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
		case tar.TypeLink:
			target := mergedUsr(strings.TrimPrefix(path.Clean("/"+h.Linkname), "/"))
			if err := t.hardlink(name, target); err != nil {
				return fmt.Errorf("%s: %w", pkg, err)
			}
		default:
			return fmt.Errorf("%s: %s: unsupported tar entry type %q", pkg, name, h.Typeflag)
		}
	}
}
