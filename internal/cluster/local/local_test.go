package local_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster/local"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func ns(name string) string {
	return "apiVersion: v1\nkind: Namespace\nmetadata: {name: " + name + "}\n"
}

func TestBadObjectNeverWipesGoodState(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "objs.yaml")
	write(t, f, ns("a")+"---\n"+"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {nodeName: n1}\n")
	write(t, filepath.Join(dir, "other.yaml"), ns("z"))
	s := local.New(dir, nil, 0)
	if changed, err := s.Load(); err != nil || !changed {
		t.Fatalf("first load: %v %v", changed, err)
	}
	objs, _ := s.Current()
	if len(objs.Pods) != 1 || len(objs.Namespaces) != 2 {
		t.Fatalf("initial state: %d pods %d namespaces", len(objs.Pods), len(objs.Namespaces))
	}

	// Break the pod document: the pod stays as it was, the error names file, doc and field.
	write(t, f, ns("a")+"---\n"+"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {nodeNam: n2}\n")
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	objs, _ = s.Current()
	if len(objs.Pods) != 1 || objs.Pods[0].Spec.NodeName != "n1" {
		t.Fatalf("bad document wiped the pod: %+v", objs.Pods)
	}
	errs := s.Errors()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "objs.yaml: document 1 (Pod a/p)") || !strings.Contains(errs[0].Error(), "nodeNam") {
		t.Fatalf("errors: %v", errs)
	}
	// The error keeps being reported while the file is unchanged.
	if _, err := s.Load(); err != nil || len(s.Errors()) != 1 {
		t.Fatalf("error forgotten: %v", s.Errors())
	}

	// Fix it: the change applies and the error clears.
	write(t, f, ns("a")+"---\n"+"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec: {nodeName: n2}\n")
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	objs, _ = s.Current()
	if objs.Pods[0].Spec.NodeName != "n2" || len(s.Errors()) != 0 {
		t.Fatalf("fix not applied: %+v errs %v", objs.Pods, s.Errors())
	}

	// Removing a file removes its objects.
	os.Remove(filepath.Join(dir, "other.yaml"))
	s.Load()
	objs, _ = s.Current()
	if len(objs.Namespaces) != 1 {
		t.Fatalf("removed file's objects remain: %+v", objs.Namespaces)
	}
}

func TestRunWatchesChanges(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), ns("a"))
	s := local.New(dir, nil, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.After(5 * time.Second)
	for {
		objs, ch := s.Current()
		if objs != nil && len(objs.Namespaces) == 2 {
			break
		}
		if objs != nil && len(objs.Namespaces) == 1 {
			write(t, filepath.Join(dir, "b.yml"), ns("b"))
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("change not seen")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestUnchangedDirectoryPublishesNothing(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), ns("a"))
	s := local.New(dir, nil, 0)
	s.Load()
	_, ch := s.Current()
	if changed, _ := s.Load(); changed {
		t.Fatal("unchanged directory reported a change")
	}
	select {
	case <-ch:
		t.Fatal("channel closed without a change")
	default:
	}
	if _, err := local.New(filepath.Join(dir, "missing"), nil, 0).Load(); err == nil {
		t.Fatal("missing directory not reported")
	}
}

// A file is read again only when its stamp moved, and an edit in place
// that keeps the size and puts the modification time back still moves it.
func TestEditInPlaceSeen(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.yaml")
	write(t, p, ns("aa"))
	s := local.New(dir, nil, 0)
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	write(t, p, ns("bb"))
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Load(); err != nil || !changed {
		t.Fatalf("edit in place: changed %v, %v", changed, err)
	}
	objs, _ := s.Current()
	if items := objs.Items(); len(items) != 1 || !strings.Contains(items[0].Key, "bb") {
		t.Fatalf("objects after the edit: %+v", items)
	}
	if changed, _ := s.Load(); changed {
		t.Fatal("unchanged file reported a change")
	}
}
