package translate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ztunnel-go/ztunnel-go/internal/cluster"
)

// istioPolicyInputs are the directories of an Istio source tree (istio/istio
// at any recent commit) that hold AuthorizationPolicy YAML written by Istio's
// authors: the authorization builder's golden inputs ("*-in.yaml", every
// action, dry-run, L7 and trust-domain forms), the CRD validation suite's
// valid policies, and the pilot integration tests' policies. Istio's
// samples/ and manifests/ hold none (only the CRD schema).
var istioPolicyInputs = []string{
	"pilot/pkg/security/authz/builder/testdata",
	"pkg/config/validation/testdata/crds/authz-valid.yaml",
	"tests/integration/pilot/testdata/authz-a.yaml",
}

// TestIstioPolicies runs policies we did not write through decoding and
// translation: each must decode, get a status, and have no value reported
// invalid (they are all valid Istio). ZTG_ISTIO_SRC names the Istio tree
// (a git checkout or its module directory); without it the test skips.
func TestIstioPolicies(t *testing.T) {
	root := os.Getenv("ZTG_ISTIO_SRC")
	if root == "" {
		t.Skip("ZTG_ISTIO_SRC is not set (path of an istio/istio source tree)")
	}
	var files []string
	for _, in := range istioPolicyInputs {
		err := filepath.WalkDir(filepath.Join(root, in), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".yaml") && (!strings.Contains(in, "builder") || strings.HasSuffix(p, "-in.yaml")) {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
	}
	policies, dry := 0, 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var objs cluster.Objects
		for _, e := range cluster.Decode(f, data, &objs) {
			if !errors.Is(e, cluster.ErrUnsupportedKind) {
				t.Errorf("decode: %v", e)
			}
		}
		if len(objs.AuthorizationPolicies) == 0 {
			continue
		}
		res := Translate(LocalDefaults(), &objs, nil)
		for _, ap := range objs.AuthorizationPolicies {
			policies++
			st := policyStatus(t, res, ap.Namespace+"/"+ap.Name)
			if len(st.Invalid) > 0 {
				t.Errorf("%s: %s/%s: valid Istio policy reported invalid: %v", f, ap.Namespace, ap.Name, st.Invalid)
			}
			a := res.Authorizations[ap.Namespace+"/"+ap.Name]
			if want := ap.Annotations[AnnotationDryRun] == "true"; st.Sent && a.GetDryRun() != want && ap.Spec.Action.String() != "AUDIT" {
				t.Errorf("%s: %s/%s: dry_run %v, annotation says %v", f, ap.Namespace, ap.Name, a.GetDryRun(), want)
			}
			if a.GetDryRun() {
				dry++
			}
		}
	}
	if policies < 30 {
		t.Fatalf("only %d policies in %d files under %s; wrong tree?", policies, len(files), root)
	}
	t.Logf("%d Istio policies from %d files translated (%d dry-run)", policies, len(files), dry)
}
