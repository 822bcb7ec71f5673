package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// component is one image: a binary of cmd/ and how it runs.
type component struct {
	name string
	// user is the image's default user (uid:gid); "0:0" where the component
	// needs root: the node agent edits pods' iptables and the host's CNI
	// config, the node proxy enters pods' network namespaces (setns needs
	// CAP_SYS_ADMIN, transparent sockets CAP_NET_ADMIN/NET_RAW).
	user string
	// debian adds the pinned Debian userspace (iptables, ipset) the binary
	// runs.
	debian bool
	// optional components are built only when their cmd/ directory exists.
	optional bool
}

// components are the images make images builds, in build order.
var components = []component{
	{name: "ztunnel", user: "0:0"},
	{name: "ztunnel-cni", user: "0:0", debian: true},
	{name: "ztunnel-cp", user: "1337:1337"},
	{name: "zctl", user: "65532:65532"},
	{name: "waypoint", user: "1337:1337", optional: true},
}

// present returns the components whose cmd/<name> directory exists in repo,
// limited to only when it is non-empty.
func present(repo string, only []string) ([]component, error) {
	want := map[string]bool{}
	for _, n := range only {
		want[n] = true
	}
	var out []component
	for _, c := range components {
		if len(want) > 0 && !want[c.name] {
			continue
		}
		delete(want, c.name)
		if _, err := os.Stat(filepath.Join(repo, "cmd", c.name)); err != nil {
			if c.optional && os.IsNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("component %s: %w", c.name, err)
		}
		out = append(out, c)
	}
	for n := range want {
		return nil, fmt.Errorf("unknown component %q", n)
	}
	return out, nil
}

// goBuild builds the components' static binaries (CGO_ENABLED=0, -trimpath,
// no VCS stamp, no build ID: the same tree gives the same bytes) into dir.
// The binaries report version (VERSION), stamped as make build does.
func goBuild(repo, dir, goarch, version string, comps []component) error {
	args := []string{"build", "-trimpath", "-buildvcs=false", "-tags=" + buildTags,
		"-ldflags=-s -w -buildid= -X github.com/ztunnel-go/ztunnel-go/internal/daemon.version=" + version, "-o", dir + "/"}
	for _, c := range comps {
		args = append(args, "./cmd/"+c.name)
	}
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch, "GOFLAGS=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

// buildTags are the build tags of every binary, the Makefile's
// GO_BUILD_TAGS: grpcnotrace leaves gRPC's golang.org/x/net/trace out
// (and with it html/template, whose reflective method calls keep every
// exported method linked: 4.6 MiB of the node proxy's mapped text and
// rodata).
const buildTags = "grpcnotrace"

func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

// meta is what the images say about their source.
type meta struct {
	Version  string    // VERSION file
	Revision string    // commit
	Source   string    // repository URL
	Created  time.Time // every timestamp in the images
}

// readMeta reads the version from repo's VERSION file and the revision and
// time from git: SOURCE_DATE_EPOCH if set, else the commit's time (so
// rebuilding a commit reproduces its images). A tree with uncommitted
// changes gets "-dirty" after the revision.
func readMeta(repo string) (meta, error) {
	var m meta
	v, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		return m, fmt.Errorf("version: %w", err)
	}
	m.Version = strings.TrimSpace(string(v))
	if m.Version == "" || strings.ContainsAny(m.Version, " \t\n/:") {
		return m, fmt.Errorf("version: VERSION holds %q, want a tag like 1.2.3", m.Version)
	}
	m.Source = "https://github.com/ztunnel-go/ztunnel-go"
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	if m.Revision, err = git("rev-parse", "HEAD"); err != nil {
		return m, err
	}
	status, err := git("status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return m, err
	}
	if status != "" {
		m.Revision += "-dirty"
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return m, err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return m, fmt.Errorf("source date %q: %w", epoch, err)
	}
	m.Created = time.Unix(sec, 0).UTC()
	return m, nil
}
