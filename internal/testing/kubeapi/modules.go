package kubeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// moduleDir returns the module cache directory of mod at the version the
// main go.mod requires (downloading it if needed), via the go command run in
// the repository root.
func moduleDir(mod string) (string, error) {
	gomod, err := repoFile("go.mod")
	if err != nil {
		return "", err
	}
	root := filepath.Dir(gomod)
	ver, err := goCmd(root, "list", "-m", "-f", "{{.Version}}", mod)
	if err != nil {
		return "", err
	}
	out, err := goCmd(root, "mod", "download", "-json", mod+"@"+ver)
	if err != nil {
		return "", err
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return "", fmt.Errorf("kubeapi: go mod download %s: %w", mod, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("kubeapi: go mod download %s@%s: %s", mod, ver, info.Error)
	}
	return info.Dir, nil
}

func goCmd(dir string, args ...string) (string, error) {
	goBin := "go"
	if _, err := exec.LookPath(goBin); err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("kubeapi: go %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return "", fmt.Errorf("kubeapi: go %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}
