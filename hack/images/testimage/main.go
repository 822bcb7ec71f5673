// Command testimage builds the real node's test images (make test-node):
// the pod sandbox (pause) image and the test workload image, both one layer
// holding the static binary of internal/testing/realnode/testapp, and the
// cluster DNS image, one layer holding the static CoreDNS binary that
// `hack/k8s/build.sh coredns` builds from CoreDNS's Go module, and the
// Gateway API conformance suite's echo image (make conformance), written as
// OCI archives that `ctr images import` reads. No registry is reachable on
// the test machines, so nothing here names a base image.
//
//	go -C hack/images run ./testimage -repo "$PWD" -out DIR [-coredns DIR/coredns] [-echo DIR]
//
// It prints one line per archive: path, reference. Without -coredns the
// CoreDNS image is not written, without -echo the echo image.
//
// The echo image stands in for the suite's registry.k8s.io/gateway-api/
// echo-advanced:v1.5.1 under that exact reference (its manifests pull it
// IfNotPresent, so the node uses the imported one): Istio's echo server
// and client built from the istio.io/istio module (hack/conformance), laid
// out as Istio's own echo image (pkg/test/echo/docker/Dockerfile.app):
// /usr/local/bin/server the entrypoint, /usr/local/bin/client on PATH (the
// suite runs `client URL` in the pod through pods/exec), and the serving
// certificate and key its --tls port reads at /cert.crt and /cert.key.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The references the real node's containerd and test pods use.
const (
	PauseRef   = "localhost/ztg-node/pause:test"
	TestAppRef = "localhost/ztg-node/testapp:test"
	CoreDNSRef = "localhost/ztg-node/coredns:test"
	appPkg     = "./internal/testing/realnode/testapp"
)

// EchoRef is the echo image's reference in Gateway API v1.6.3's mesh
// manifests (conformance/mesh/manifests.yaml).
const EchoRef = "registry.k8s.io/gateway-api/echo-advanced:v1.5.1"

func main() {
	log.SetFlags(0)
	repo := flag.String("repo", "", "repository root (required)")
	out := flag.String("out", "", "output directory (required)")
	coredns := flag.String("coredns", "", "the static CoreDNS binary for the cluster DNS image (hack/k8s/build.sh coredns)")
	echo := flag.String("echo", "", "a directory with Istio's static echo server and client and cert.crt, cert.key for the conformance echo image")
	flag.Parse()
	if *repo == "" || *out == "" {
		log.Fatal("testimage: -repo and -out are required")
	}
	if err := run(*repo, *out, *coredns, *echo); err != nil {
		log.Fatalf("testimage: %v", err)
	}
}

func run(repo, out, coredns, echo string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	bin, err := os.MkdirTemp(out, ".bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	cmd := exec.Command(goTool(), "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", filepath.Join(bin, "testapp"), appPkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", appPkg, err, b)
	}
	data, err := os.ReadFile(filepath.Join(bin, "testapp"))
	if err != nil {
		return err
	}
	type spec struct {
		ref, file  string
		files      []file
		entrypoint []string
		user       string
	}
	images := []spec{
		{PauseRef, "pause.tar", []file{{"testapp", 0o755, data}}, []string{"/testapp", "pause"}, "65535:65535"},
		{TestAppRef, "testapp.tar", []file{{"testapp", 0o755, data}}, []string{"/testapp"}, "65532:65532"},
	}
	if coredns != "" {
		dns, err := os.ReadFile(coredns)
		if err != nil {
			return fmt.Errorf("coredns binary: %w", err)
		}
		// Non-root; the Corefile (a ConfigMap mounted by the Deployment)
		// listens on unprivileged ports, so no capability is needed.
		images = append(images, spec{CoreDNSRef, "coredns.tar", []file{{"coredns", 0o755, dns}}, []string{"/coredns"}, "65532:65532"})
	}
	if echo != "" {
		var files []file
		for _, f := range []struct {
			src, dst string
			mode     int64
		}{
			{"server", "usr/local/bin/server", 0o755},
			{"client", "usr/local/bin/client", 0o755},
			{"cert.crt", "cert.crt", 0o644},
			{"cert.key", "cert.key", 0o644},
		} {
			b, err := os.ReadFile(filepath.Join(echo, f.src))
			if err != nil {
				return fmt.Errorf("echo image: %w", err)
			}
			files = append(files, file{f.dst, f.mode, b})
		}
		// Istio's image runs it as 1338; the mesh does not care which
		// non-root user (no sidecar capture to exempt).
		images = append(images, spec{EchoRef, "echo.tar", files, []string{"/usr/local/bin/server"}, "1338:1338"})
	}
	for _, im := range images {
		img, err := image(im.files, im.entrypoint, im.user)
		if err != nil {
			return fmt.Errorf("%s: %w", im.ref, err)
		}
		ref, err := name.NewTag(im.ref)
		if err != nil {
			return err
		}
		path := filepath.Join(out, im.file)
		if err := tarball.WriteToFile(path, ref, img); err != nil {
			return fmt.Errorf("%s: write: %w", im.ref, err)
		}
		fmt.Printf("%s\t%s\n", path, im.ref)
	}
	return nil
}

// file is one regular file of an image, at path (relative to /).
type file struct {
	path string
	mode int64
	data []byte
}

// image is one layer holding files (their parent directories made) and an
// empty /tmp, with a fixed timestamp.
func image(files []file, entrypoint []string, user string) (v1.Image, error) {
	epoch := time.Unix(0, 0).UTC()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.path); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.path, Typeflag: tar.TypeReg, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{Entrypoint: entrypoint, User: user, WorkingDir: "/",
		Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	return mutate.ConfigFile(img, cf)
}

func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}
