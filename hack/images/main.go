// Command images builds ztunnel-go's container images without a container
// daemon and without a base image (make images): each is the project's
// static Go binary (CGO_ENABLED=0, -trimpath) on a small base layer of
// accounts; the node agent's (ztunnel-cni) also carries the iptables (legacy
// and nft) and ipset userspace it runs, unpacked from the Debian packages
// pinned in debian.lock with their copyright files. Images are written with
// go-containerregistry as OCI archives, one per component
// (<out>/<component>.tar), reproducibly: fixed timestamps (the commit's time,
// or SOURCE_DATE_EPOCH), sorted entries, owner 0:0, so building a commit twice
// gives the same digests.
//
// Usage (from the repository root):
//
//	go -C hack/images run . -repo "$PWD" -out bin/images [-registry REG] [-only ztunnel,zctl]
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// options are the builder's inputs.
type options struct {
	Repo     string   // repository root
	Out      string   // directory the archives go into
	Registry string   // registry/namespace in the images' references
	Only     []string // components to build; empty means all present
	Cache    string   // directory the .deb files are cached in
	Arch     string   // GOARCH; Debian's architecture name is the same for amd64
	Logf     func(string, ...any)
	// Meta overrides the version, revision and time read from the tree
	// when its Version is set (tests pin them).
	Meta meta
}

// result is one built image.
type result struct {
	Component string
	Ref       string
	Archive   string
	Digest    v1.Hash
	Image     v1.Image
}

func main() {
	log.SetFlags(0)
	var o options
	var only string
	flag.StringVar(&o.Repo, "repo", "", "repository root (required)")
	flag.StringVar(&o.Out, "out", "", "output directory for the OCI archives (default <repo>/bin/images)")
	flag.StringVar(&o.Registry, "registry", "ghcr.io/ztunnel-go", "registry and namespace named in the images' references")
	flag.StringVar(&only, "only", "", "comma-separated components to build (default: all)")
	flag.StringVar(&o.Cache, "cache", "", "cache directory for Debian packages (default $XDG_CACHE_HOME or ~/.cache, /ztunnel-go/debs)")
	flag.Parse()
	if o.Repo == "" {
		log.Fatal("images: -repo is required")
	}
	if only != "" {
		o.Only = strings.Split(only, ",")
	}
	o.Logf = log.Printf
	results, err := build(o)
	if err != nil {
		log.Fatalf("images: %v", err)
	}
	for _, r := range results {
		fmt.Printf("%s\t%s\t%s\n", r.Archive, r.Ref, r.Digest)
	}
}

func defaultCache() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache dir: %w", err)
	}
	return filepath.Join(dir, "ztunnel-go", "debs"), nil
}

// build builds every requested component's image and writes its archive.
func build(o options) ([]result, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	if o.Arch != "amd64" {
		return nil, fmt.Errorf("architecture %s: debian.lock pins amd64 packages only", o.Arch)
	}
	repo, err := filepath.Abs(o.Repo)
	if err != nil {
		return nil, err
	}
	if o.Out == "" {
		o.Out = filepath.Join(repo, "bin", "images")
	}
	if o.Cache == "" {
		if o.Cache, err = defaultCache(); err != nil {
			return nil, err
		}
	}
	m := o.Meta
	if m.Version == "" {
		if m, err = readMeta(repo); err != nil {
			return nil, err
		}
	}
	comps, err := present(repo, o.Only)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	binDir, err := os.MkdirTemp(o.Out, ".bin-")
	if err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	defer os.RemoveAll(binDir)
	o.Logf("go build %d binaries (linux/%s, static)", len(comps), o.Arch)
	if err := goBuild(repo, binDir, o.Arch, m.Version, comps); err != nil {
		return nil, err
	}
	base, err := baseTree()
	if err != nil {
		return nil, err
	}
	var deb *tree
	for _, c := range comps {
		if c.debian && deb == nil {
			if deb, err = loadDebian(repo, o); err != nil {
				return nil, err
			}
		}
	}
	var results []result
	for _, c := range comps {
		bin, err := binaryTree(c.name, binDir)
		if err != nil {
			return nil, err
		}
		layers := []layerSpec{{base, "base: accounts, /tmp"}}
		if c.debian {
			layers = append(layers, layerSpec{deb, "debian: hack/images/debian.lock"})
		}
		layers = append(layers, layerSpec{bin, "go build ./cmd/" + c.name})
		img, err := buildImage(c, m, o.Arch, layers)
		if err != nil {
			return nil, err
		}
		ref := fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(o.Registry, "/"), c.name, m.Version)
		archive := filepath.Join(o.Out, c.name+".tar")
		if err := writeArchive(img, ref, archive, m); err != nil {
			return nil, err
		}
		d, err := img.Digest()
		if err != nil {
			return nil, fmt.Errorf("%s: digest: %w", c.name, err)
		}
		results = append(results, result{Component: c.name, Ref: ref, Archive: archive, Digest: d, Image: img})
	}
	return results, nil
}

func loadDebian(repo string, o options) (*tree, error) {
	lock, err := os.ReadFile(filepath.Join(repo, "hack", "images", "debian.lock"))
	if err != nil {
		return nil, fmt.Errorf("debian.lock: %w", err)
	}
	pkgs, err := parseLock(lock)
	if err != nil {
		return nil, err
	}
	debs, err := fetchDebs(pkgs, o.Cache, o.Logf)
	if err != nil {
		return nil, err
	}
	return debianTree(pkgs, debs)
}
