package main

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotation and label keys (OCI image spec; containerd's image name).
const (
	labelSource        = "org.opencontainers.image.source"
	labelVersion       = "org.opencontainers.image.version"
	labelRevision      = "org.opencontainers.image.revision"
	labelCreated       = "org.opencontainers.image.created"
	labelTitle         = "org.opencontainers.image.title"
	annotationRefName  = "org.opencontainers.image.ref.name"
	annotationCtrdName = "io.containerd.image.name"
)

const imagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// baseTree is the layer every image starts from: the accounts the images
// run as (root, istio-proxy 1337 as Istio's proxies use, nonroot 65532) and
// a /tmp. No shell, no package manager.
func baseTree() (*tree, error) {
	t := newTree()
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"istio-proxy:x:1337:1337:istio-proxy:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n"
	group := "root:x:0:\nistio-proxy:x:1337:\nnonroot:x:65532:\n"
	for _, err := range []error{
		t.file("etc/passwd", 0o644, []byte(passwd)),
		t.file("etc/group", 0o644, []byte(group)),
		t.dir("root", 0o700),
		t.dir("tmp", 0o777|fs.ModeSticky),
	} {
		if err != nil {
			return nil, err
		}
	}
	return t, nil
}

// debianTree is the agent's userspace from the pinned packages, in the
// merged-/usr layout, with the `iptables`/`ip6tables` names (Debian makes
// them with update-alternatives at install time, which an unpacked package
// lacks) pointing at the nf_tables variant as Debian's default does. The
// agent picks legacy or nft itself (cni/rules.DetectMode); these names are
// its fallback when the host has no rules in either.
func debianTree(pkgs []debPackage, debs []string) (*tree, error) {
	t := newTree()
	for i, p := range pkgs {
		if err := addDeb(t, p, debs[i]); err != nil {
			return nil, err
		}
	}
	for _, top := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := t.symlink(top, "usr/"+top); err != nil {
			return nil, err
		}
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			if err := t.symlink("usr/sbin/"+fam+suffix, "xtables-nft-multi"); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// binaryTree holds one static binary at /usr/local/bin/<name>.
func binaryTree(name, binDir string) (*tree, error) {
	data, err := os.ReadFile(filepath.Join(binDir, name))
	if err != nil {
		return nil, fmt.Errorf("binary %s: %w", name, err)
	}
	t := newTree()
	return t, t.file("usr/local/bin/"+name, 0o755, data)
}

// layerSpec is one layer of an image and the history line that says where
// it came from.
type layerSpec struct {
	tree      *tree
	createdBy string
}

// buildImage assembles an OCI image from the layers and the component's
// run settings.
func buildImage(c component, m meta, goarch string, layers []layerSpec) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	created := v1.Time{Time: m.Created}
	var adds []mutate.Addendum
	for _, l := range layers {
		layer, err := l.tree.layer(m.Created)
		if err != nil {
			return nil, fmt.Errorf("%s: layer: %w", c.name, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: created, CreatedBy: l.createdBy, Comment: "hack/images"},
		})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", c.name, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = goarch
	cf.OS = "linux"
	cf.Created = created
	cf.Author = ""
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/local/bin/" + c.name},
		Env:        []string{"PATH=" + imagePath},
		User:       c.user,
		WorkingDir: "/",
		Labels:     labels(c, m),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", c.name, err)
	}
	return img, nil
}

func labels(c component, m meta) map[string]string {
	return map[string]string{
		labelSource:   m.Source,
		labelVersion:  m.Version,
		labelRevision: m.Revision,
		labelCreated:  m.Created.Format("2006-01-02T15:04:05Z"),
		labelTitle:    c.name,
	}
}

// writeArchive writes img as an OCI archive (a tar of an OCI image layout:
// oci-layout, index.json, blobs/sha256/...) at out, with the image's full
// reference in the index annotations (org.opencontainers.image.ref.name,
// read by podman and skopeo; io.containerd.image.name, read by
// `ctr images import`). It also holds a manifest.json in the form of
// `docker save` pointing at the same blobs, so `docker load` and
// `crane push <archive>` read it too. Entries are sorted, owned by 0:0 and
// stamped with mtime: the same image gives the same archive bytes.
func writeArchive(img v1.Image, ref, out string, m meta) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return fmt.Errorf("archive %s: %w", out, err)
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("archive %s: layout: %w", out, err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		annotationRefName:  ref,
		annotationCtrdName: ref,
	})); err != nil {
		return fmt.Errorf("archive %s: layout: %w", out, err)
	}
	if err := writeDockerManifest(dir, img, ref); err != nil {
		return fmt.Errorf("archive %s: %w", out, err)
	}
	tmp := out + ".tmp"
	if err := tarDir(dir, tmp, m); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("archive %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("archive %s: %w", out, err)
	}
	return nil
}

func writeDockerManifest(dir string, img v1.Image, ref string) error {
	cfg, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("config digest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	entry := struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{Config: "blobs/sha256/" + cfg.Hex, RepoTags: []string{ref}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("layer digest: %w", err)
		}
		entry.Layers = append(entry.Layers, "blobs/sha256/"+d.Hex)
	}
	data, err := json.Marshal([]any{entry})
	if err != nil {
		return fmt.Errorf("manifest.json: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), data, 0o644)
}

// tarDir writes the directory tree at dir as a tar file at out.
func tarDir(dir, out string, m meta) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			f.Close()
			return err
		}
		st, err := os.Lstat(p)
		if err != nil {
			f.Close()
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: m.Created, Mode: 0o644, Format: tar.FormatPAX}
		switch {
		case st.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		case st.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		default:
			f.Close()
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		if h.Typeflag == tar.TypeReg {
			src, err := os.Open(p)
			if err != nil {
				f.Close()
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				f.Close()
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
