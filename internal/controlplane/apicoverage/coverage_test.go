package apicoverage

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestFieldCoverage requires every field of every kind to be decided by
// exactly one entry, each entry to name a real field, and each decision to
// carry its proof or its reason.
func TestFieldCoverage(t *testing.T) {
	for _, k := range Kinds() {
		t.Run(k.Name, func(t *testing.T) {
			for _, p := range Problems(k) {
				t.Error(p)
			}
		})
	}
	known := map[string]bool{}
	for _, k := range Kinds() {
		known[k.Name] = true
	}
	for kind := range table {
		if !known[kind] {
			t.Errorf("table has kind %s that Kinds does not list", kind)
		}
	}
}

var update = flag.Bool("update", false, "rewrite docs/api-coverage.md")

// TestAPICoverageDoc keeps docs/api-coverage.md equal to the table.
func TestAPICoverageDoc(t *testing.T) {
	path := filepath.Join(moduleRoot(t), "docs", "api-coverage.md")
	want := Markdown()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != want {
		t.Fatalf("docs/api-coverage.md is stale (err %v): run go test ./internal/controlplane/apicoverage -run TestAPICoverageDoc -update", err)
	}
}

// TestFieldCoverageTestsExist requires every test the table names to be a
// test function of this module, so a proof cannot name a test that was
// renamed or never written.
func TestFieldCoverageTestsExist(t *testing.T) {
	root := moduleRoot(t)
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".tools" || d.Name() == ".git" || d.Name() == "hack" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, "_test.go") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
				defined[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for kind, entries := range table {
		for _, e := range entries {
			if e.Test == "" {
				continue
			}
			name, _, _ := strings.Cut(e.Test, "/")
			if !defined[name] {
				t.Errorf("%s %s names test %s, which no _test.go file of the module defines", kind, e.Path, e.Test)
			}
		}
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
