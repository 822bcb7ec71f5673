package install

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

const primary = `{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"bridge","bridge":"cni0"},{"type":"portmap"}]}`

func setup(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "self")
	if err := os.WriteFile(bin, []byte("binary v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "net.d")
	os.MkdirAll(conf, 0o755)
	if err := os.WriteFile(filepath.Join(conf, "10-k8s.conflist"), []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}
	// A later list: never the primary.
	if err := os.WriteFile(filepath.Join(conf, "90-other.conflist"), []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}
	return Config{BinDir: filepath.Join(dir, "bin"), ConfDir: conf, Binary: bin,
		Plugin: map[string]any{"agent_socket": "/run/x.sock", "type": "overridden"}}
}

func plugins(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Name    string           `json:"name"`
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	if c.Name != "k8s" {
		t.Fatalf("conflist lost its name: %s", data)
	}
	return c.Plugins
}

func types(ps []map[string]any) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p["type"].(string))
	}
	return out
}

func TestInstallUninstall(t *testing.T) {
	cfg := setup(t)
	res, err := Install(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !res.BinaryChanged || !res.ConfChanged || filepath.Base(res.Conflist) != "10-k8s.conflist" {
		t.Fatalf("first Install: %+v", res)
	}
	ps := plugins(t, res.Conflist)
	if got := types(ps); !reflect.DeepEqual(got, []string{"bridge", "portmap", PluginType}) {
		t.Fatalf("plugins %v", got)
	}
	if ps[2]["agent_socket"] != "/run/x.sock" {
		t.Fatalf("our entry %v", ps[2])
	}
	if got := types(plugins(t, filepath.Join(cfg.ConfDir, "90-other.conflist"))); len(got) != 2 {
		t.Fatalf("non-primary conflist edited: %v", got)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.BinDir, PluginType)); err != nil || string(b) != "binary v1" {
		t.Fatalf("binary %q, %v", b, err)
	}

	// Idempotent: nothing changes.
	if res, err := Install(cfg); err != nil || res.BinaryChanged || res.ConfChanged {
		t.Fatalf("second Install: %+v, %v", res, err)
	}
	// New settings and binary (upgrade): one entry, updated.
	cfg.Plugin["agent_socket"] = "/run/y.sock"
	os.WriteFile(cfg.Binary, []byte("binary v2"), 0o755)
	if res, err := Install(cfg); err != nil || !res.BinaryChanged || !res.ConfChanged {
		t.Fatalf("upgrade Install: %+v, %v", res, err)
	}
	ps = plugins(t, res.Conflist)
	if len(ps) != 3 || ps[2]["agent_socket"] != "/run/y.sock" {
		t.Fatalf("after upgrade %v", ps)
	}

	if err := Uninstall(cfg); err != nil {
		t.Fatal(err)
	}
	if got := types(plugins(t, res.Conflist)); !reflect.DeepEqual(got, []string{"bridge", "portmap"}) {
		t.Fatalf("after Uninstall %v", got)
	}
	if _, err := os.Stat(filepath.Join(cfg.BinDir, PluginType)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("binary left: %v", err)
	}
	if err := Uninstall(cfg); err != nil {
		t.Fatalf("second Uninstall: %v", err)
	}
}

func TestInstallErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		conf    string // content of 10-k8s.conflist; "" = no conflist
		wantErr error
	}{
		{"no conflist", "", ErrNoConflist},
		{"not json", "{", nil},
		{"no plugins", `{"name":"k8s"}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := setup(t)
			os.Remove(filepath.Join(cfg.ConfDir, "90-other.conflist"))
			path := filepath.Join(cfg.ConfDir, "10-k8s.conflist")
			if tc.conf == "" {
				os.Remove(path)
			} else {
				os.WriteFile(path, []byte(tc.conf), 0o644)
			}
			_, err := Install(cfg)
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Install: %v, want error %v", err, tc.wantErr)
			}
			if tc.conf != "" {
				if b, _ := os.ReadFile(path); string(b) != tc.conf {
					t.Fatalf("bad conflist rewritten: %q", b)
				}
			}
		})
	}
}

// TestInstallSinglePluginInConflistFile: a single plugin's config kept in a
// file named .conflist is converted in place. The conversion used to write
// the list to the same path and then remove "the old file": the runtime's
// only config was gone.
func TestInstallSinglePluginInConflistFile(t *testing.T) {
	cfg := setup(t)
	path := filepath.Join(cfg.ConfDir, "10-k8s.conflist")
	if err := os.WriteFile(path, []byte(`{"cniVersion":"1.0.0","name":"k8s","type":"bridge","bridge":"cni0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Install(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Conflist != path || !res.ConfChanged {
		t.Fatalf("Install = %+v, want %s converted", res, path)
	}
	if got, want := types(plugins(t, path)), []string{"bridge", PluginType}; !reflect.DeepEqual(got, want) {
		t.Fatalf("plugins %v, want %v", got, want)
	}
}

// TestConfKind: what Install decides from one read of the primary file. A
// file caught empty mid-rewrite is no CNI config, so Install refuses it
// rather than converting what a second read would find.
func TestConfKind(t *testing.T) {
	for _, tc := range []struct {
		data     string
		list, ok bool
	}{
		{primary, true, true},
		{`{"cniVersion":"1.0.0","name":"k8s","type":"bridge"}`, false, true},
		{``, false, false},
		{`{"cniVersion":"1.0.0","na`, false, false},
		{`{"name":"k8s"}`, false, false},
	} {
		if list, ok := confKind([]byte(tc.data)); list != tc.list || ok != tc.ok {
			t.Errorf("confKind(%q) = %v, %v, want %v, %v", tc.data, list, ok, tc.list, tc.ok)
		}
	}
}

// The Keeper re-checks every few seconds: an unchanged pair of binaries is
// told by their stamps, not by reading both, and any write to either is
// still seen, including one that keeps the size and puts the modification
// time back.
func TestInstallBinaryCheckedByStamp(t *testing.T) {
	cfg := setup(t)
	dst := filepath.Join(cfg.BinDir, PluginType)
	if res, err := Install(cfg); err != nil || !res.BinaryChanged {
		t.Fatalf("first Install: %+v, %v", res, err)
	}
	compares := binaryCompares.Load()
	for range 3 {
		if res, err := Install(cfg); err != nil || res.BinaryChanged {
			t.Fatalf("unchanged Install: %+v, %v", res, err)
		}
	}
	if n := binaryCompares.Load() - compares; n != 0 {
		t.Fatalf("unchanged binaries compared byte for byte %d times", n)
	}

	// Tampered in place: same size, modification time restored.
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, []byte("binary XX"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dst, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if res, err := Install(cfg); err != nil || !res.BinaryChanged {
		t.Fatalf("Install after tampering: %+v, %v", res, err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "binary v1" {
		t.Fatalf("binary %q, %v", b, err)
	}

	// The source rewritten with the same bytes: compared once, not copied.
	compares = binaryCompares.Load()
	if err := os.WriteFile(cfg.Binary, []byte("binary v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if res, err := Install(cfg); err != nil || res.BinaryChanged {
		t.Fatalf("Install after rewriting the source unchanged: %+v, %v", res, err)
	}
	if n := binaryCompares.Load() - compares; n != 1 {
		t.Fatalf("compared %d times, want 1", n)
	}

	// Removed: written again.
	if err := os.Remove(dst); err != nil {
		t.Fatal(err)
	}
	if res, err := Install(cfg); err != nil || !res.BinaryChanged {
		t.Fatalf("Install after removal: %+v, %v", res, err)
	}
}

func TestSameContent(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	big := make([]byte, 600<<10) // spans chunks
	for i := range big {
		big[i] = byte(i * 7)
	}
	a := write("a", big)
	b := write("b", big)
	other := append([]byte(nil), big...)
	other[len(other)-1]++
	c := write("c", other)
	d := write("d", big[:len(big)-1])
	e := write("e", nil)
	f := write("f", nil)
	for _, tc := range []struct {
		x, y string
		want bool
	}{{a, b, true}, {a, c, false}, {a, d, false}, {d, a, false}, {e, f, true}, {a, filepath.Join(dir, "missing"), false}} {
		if got, err := sameContent(tc.x, tc.y); err != nil || got != tc.want {
			t.Errorf("sameContent(%s, %s) = %v, %v; want %v", filepath.Base(tc.x), filepath.Base(tc.y), got, err, tc.want)
		}
	}
	if _, err := sameContent(filepath.Join(dir, "missing"), a); err == nil {
		t.Error("a missing source is not an error")
	}
}
