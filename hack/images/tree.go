package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file, directory or symlink of a layer.
type entry struct {
	typ  byte // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode fs.FileMode
	data []byte
	link string
}

// tree is a layer's content before it is written: paths (relative, clean,
// no leading slash) to entries. Parent directories are created on the way.
// Written out, every entry is owned by 0:0 with the same timestamp, in
// sorted path order, so equal trees give byte-equal layers.
type tree struct {
	entries map[string]*entry
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

func (t *tree) parents(name string) error {
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		e, ok := t.entries[dir]
		if !ok {
			t.entries[dir] = &entry{typ: tar.TypeDir, mode: 0o755}
			continue
		}
		if e.typ != tar.TypeDir {
			return fmt.Errorf("%s: parent %s is not a directory", name, dir)
		}
	}
	return nil
}

func (t *tree) check(name string) error {
	if name == "" || name == "." || path.Clean(name) != name || strings.HasPrefix(name, "/") || strings.HasPrefix(name, "../") {
		return fmt.Errorf("layer path %q is not clean and relative", name)
	}
	return t.parents(name)
}

func (t *tree) dir(name string, mode fs.FileMode) error {
	if err := t.check(name); err != nil {
		return err
	}
	if e, ok := t.entries[name]; ok && e.typ != tar.TypeDir {
		return fmt.Errorf("%s: directory over a non-directory", name)
	}
	t.entries[name] = &entry{typ: tar.TypeDir, mode: mode}
	return nil
}

func (t *tree) file(name string, mode fs.FileMode, data []byte) error {
	if err := t.check(name); err != nil {
		return err
	}
	if e, ok := t.entries[name]; ok && e.typ == tar.TypeDir {
		return fmt.Errorf("%s: file over a directory", name)
	}
	t.entries[name] = &entry{typ: tar.TypeReg, mode: mode, data: data}
	return nil
}

func (t *tree) symlink(name, target string) error {
	if err := t.check(name); err != nil {
		return err
	}
	if e, ok := t.entries[name]; ok && e.typ == tar.TypeDir {
		return fmt.Errorf("%s: symlink over a directory", name)
	}
	t.entries[name] = &entry{typ: tar.TypeSymlink, mode: 0o777, link: target}
	return nil
}

// hardlink adds name as a copy of the regular file target (already added).
func (t *tree) hardlink(name, target string) error {
	e, ok := t.entries[target]
	if !ok || e.typ != tar.TypeReg {
		return fmt.Errorf("%s: hard link to %s, which is no regular file here", name, target)
	}
	return t.file(name, e.mode, e.data)
}

// tar writes the tree as a tar stream: sorted paths, owner 0:0, every
// timestamp mtime, PAX-free USTAR/GNU headers as archive/tar picks them.
func (t *tree) tar(mtime time.Time) ([]byte, error) {
	names := make([]string, 0, len(t.entries))
	for name := range t.entries {
		names = append(names, name)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range names {
		e := t.entries[name]
		h := &tar.Header{
			Typeflag: e.typ,
			Name:     name,
			Mode:     int64(e.mode.Perm()),
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		if e.mode&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if e.mode&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if e.mode&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch e.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(e.data))
		case tar.TypeSymlink:
			h.Linkname = e.link
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", name, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return nil, fmt.Errorf("tar %s: %w", name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("tar: %w", err)
	}
	return buf.Bytes(), nil
}

// layer turns the tree into an OCI layer (gzip, default level: deterministic
// for the same input and Go version).
func (t *tree) layer(mtime time.Time) (v1.Layer, error) {
	data, err := t.tar(mtime)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}
