// Command testimage builds the real node's test images (make test-node):
// the pod sandbox (pause) image and the test workload image, both one layer
// holding the static binary of internal/testing/realnode/testapp, and the
// cluster DNS image, one layer holding the static CoreDNS binary that
// `hack/k8s/build.sh coredns` builds from CoreDNS's Go module, written as
// OCI archives that `ctr images import` reads. No registry is reachable on
// the test machines, so nothing here names a base image.
//
//	go -C hack/images run ./testimage -repo "$PWD" -out DIR [-coredns DIR/coredns]
//
// It prints one line per archive: path, reference. Without -coredns the
// CoreDNS image is not written.
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

func main() {
	log.SetFlags(0)
	repo := flag.String("repo", "", "repository root (required)")
	out := flag.String("out", "", "output directory (required)")
	coredns := flag.String("coredns", "", "the static CoreDNS binary for the cluster DNS image (hack/k8s/build.sh coredns)")
	flag.Parse()
	if *repo == "" || *out == "" {
		log.Fatal("testimage: -repo and -out are required")
	}
	if err := run(*repo, *out, *coredns); err != nil {
		log.Fatalf("testimage: %v", err)
	}
}

func run(repo, out, coredns string) error {
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
		bin        string // the path of the binary in the image
		data       []byte
		entrypoint []string
		user       string
	}
	images := []spec{
		{PauseRef, "pause.tar", "testapp", data, []string{"/testapp", "pause"}, "65535:65535"},
		{TestAppRef, "testapp.tar", "testapp", data, []string{"/testapp"}, "65532:65532"},
	}
	if coredns != "" {
		dns, err := os.ReadFile(coredns)
		if err != nil {
			return fmt.Errorf("coredns binary: %w", err)
		}
		// Non-root; the Corefile (a ConfigMap mounted by the Deployment)
		// listens on unprivileged ports, so no capability is needed.
		images = append(images, spec{CoreDNSRef, "coredns.tar", "coredns", dns, []string{"/coredns"}, "65532:65532"})
	}
	for _, im := range images {
		img, err := image(im.bin, im.data, im.entrypoint, im.user)
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

// image is one layer holding the binary bin at /name (and an empty /tmp),
// with a fixed timestamp.
func image(name string, bin []byte, entrypoint []string, user string) (v1.Image, error) {
	epoch := time.Unix(0, 0).UTC()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
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
