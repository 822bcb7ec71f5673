package repotest

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repo root not found at %s: %v", dir, err)
	}
	return dir
}

// TestPackageDocs fails when a package has no "// Package x" doc comment, or
// has more than one (STYLE G15).
func TestPackageDocs(t *testing.T) {
	root := repoRoot(t)
	dirs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 3 {
		t.Fatalf("found only %d packages; walk is broken", len(dirs))
	}
	var keys []string
	for k := range dirs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, dir := range keys {
		docs := 0
		var pkgName string
		for _, f := range dirs[dir] {
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			pkgName = file.Name.Name
			if file.Doc != nil && strings.HasPrefix(file.Doc.Text(), "Package "+pkgName+" ") {
				docs++
			}
		}
		rel, _ := filepath.Rel(root, dir)
		switch {
		case pkgName == "main":
			// Commands document themselves with a "Command x" or "Package main" doc; require some doc.
			if !hasAnyDoc(t, dirs[dir]) {
				t.Errorf("%s: command has no doc comment", rel)
			}
		case docs == 0:
			t.Errorf("%s: package %s has no \"// Package %s ...\" doc comment", rel, pkgName, pkgName)
		case docs > 1:
			t.Errorf("%s: package %s has %d package doc comments, want exactly one", rel, pkgName, docs)
		}
	}
}

func hasAnyDoc(t *testing.T, files []string) bool {
	for _, f := range files {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err == nil && file.Doc != nil && strings.TrimSpace(file.Doc.Text()) != "" {
			return true
		}
	}
	return false
}

// TestDependencyDirections keeps the data path small and honest (STYLE G15):
// hbone/ and proxy/ never import Kubernetes clients, hbone/ never imports the
// node state, and no data-path package imports the CA.
func TestDependencyDirections(t *testing.T) {
	root := repoRoot(t)
	rules := []struct {
		pkg       string
		forbidden []string
	}{
		{"./hbone/...", []string{"k8s.io/client-go", "github.com/ztunnel-go/ztunnel-go/internal/node/state", "github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca", "github.com/ztunnel-go/ztunnel-go/internal/controlplane"}},
		{"./proxy/...", []string{"k8s.io/client-go", "github.com/ztunnel-go/ztunnel-go/internal/controlplane/ca", "github.com/ztunnel-go/ztunnel-go/internal/controlplane"}},
		{"./dnsproxy/...", []string{"k8s.io/client-go", "github.com/ztunnel-go/ztunnel-go/internal/controlplane"}},
		// Test support is never linked into a product binary.
		{"./cmd/ztunnel", []string{"github.com/ztunnel-go/ztunnel-go/internal/testing/testcluster", "github.com/ztunnel-go/ztunnel-go/internal/testing"}},
	}
	for _, r := range rules {
		if _, err := os.Stat(filepath.Join(root, strings.TrimSuffix(r.pkg, "/..."))); err != nil {
			continue // package not written yet
		}
		cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Deps,Standard", r.pkg)
		cmd.Dir = root
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(out)
		seen := map[string]bool{}
		for {
			var p struct{ ImportPath string }
			if err := dec.Decode(&p); err == io.EOF {
				break
			} else if err != nil {
				t.Fatal(err)
			}
			seen[p.ImportPath] = true
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("go list %s: %v", r.pkg, err)
		}
		for dep := range seen {
			for _, f := range r.forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s depends on %s, which it must not", r.pkg, dep)
				}
			}
		}
	}
}
