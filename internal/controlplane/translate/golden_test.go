package translate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
	"github.com/ztunnel-go/ztunnel-go/internal/controlplane/autoalloc"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

// configFor lets a test case change the local-mode defaults.
var configFor = map[string]func(*Config){
	"externalname-off": func(c *Config) { c.EnableExternalNameAlias = false },
	"enrollment-annotation-only": func(c *Config) {
		c.EnrollmentFromLabels = false
	},
	"trustdomain": func(c *Config) {
		c.TrustDomain = "example.org"
		c.ClusterID = "east"
		c.Network = "net1"
		c.RootNamespace = "mesh-root"
	},
}

func loadObjects(t *testing.T, path string) *cluster.Objects {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var objs cluster.Objects
	if errs := cluster.Decode(path, data, &objs); len(errs) > 0 {
		t.Fatalf("decode: %v", errs)
	}
	objs.Sort()
	return &objs
}

func translateFile(t *testing.T, name string, objs *cluster.Objects) *Result {
	t.Helper()
	cfg := LocalDefaults()
	if f := configFor[name]; f != nil {
		f(&cfg)
	}
	al, err := autoalloc.New(autoalloc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	allocs, err := al.Allocate(objs.ServiceEntries)
	if err != nil {
		t.Fatal(err)
	}
	return Translate(cfg, objs, allocs)
}

// goldenJSON renders a Result as stable, indented JSON (protojson output
// re-indented through encoding/json, which sorts map keys).
func goldenJSON(t *testing.T, r *Result) []byte {
	t.Helper()
	pj := func(m proto.Message) json.RawMessage {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		out, _ := json.Marshal(readableIPs(v, ""))
		return out
	}
	doc := map[string]any{}
	addrs := map[string]json.RawMessage{}
	for k, v := range r.Addresses.All() {
		addrs[k] = pj(v)
	}
	authz := map[string]json.RawMessage{}
	for k, v := range r.Authorizations {
		authz[k] = pj(v)
	}
	doc["addresses"] = addrs
	doc["authorizations"] = authz
	doc["waypointPolicies"] = r.WaypointPolicies
	doc["allocations"] = r.Allocations
	doc["policies"] = r.Policies
	doc["warnings"] = r.Warnings
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readableIPs replaces base64 address bytes (fields "address" and
// "addresses") with IP text, so golden files can be reviewed.
func readableIPs(v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = readableIPs(e, k)
		}
	case []any:
		for i, e := range x {
			x[i] = readableIPs(e, key)
		}
	case string:
		if key == "address" || key == "addresses" {
			if b, err := base64.StdEncoding.DecodeString(x); err == nil {
				if ip, ok := netip.AddrFromSlice(b); ok {
					return ip.String()
				}
			}
		}
	}
	return v
}

func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test inputs: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			got := goldenJSON(t, translateFile(t, name, loadObjects(t, f)))
			golden := strings.TrimSuffix(f, ".yaml") + ".golden.json"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s (run go test -update and review the diff):\n%s", golden, got)
			}
		})
	}
}
