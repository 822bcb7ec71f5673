package repotest

import (
	"go/parser"
	"go/token"
	"os"
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
// has more than one.
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
