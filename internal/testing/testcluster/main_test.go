package testcluster

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// fakePluginName is the CNI plugin type served by this test binary itself
// (through a symlink in a per-test plugin dir): it stands in for the mesh's
// chained plugin, failing ADD while its "gate" file is missing, like
// istio-cni while the node agent is down.
const fakePluginName = "ztg-fake-plugin"

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == fakePluginName {
		os.Exit(fakePlugin())
	}
	os.Exit(m.Run())
}

func fakePlugin() int {
	conf, err := io.ReadAll(os.Stdin)
	if err != nil {
		return 1
	}
	var c struct {
		CNIVersion string          `json:"cniVersion"`
		Gate       string          `json:"gate"`
		PrevResult json.RawMessage `json:"prevResult"`
	}
	if err := json.Unmarshal(conf, &c); err != nil {
		fmt.Printf(`{"cniVersion":"1.0.0","code":6,"msg":%q}`, err.Error())
		return 1
	}
	switch os.Getenv("CNI_COMMAND") {
	case "ADD":
		if _, err := os.Stat(c.Gate); err != nil {
			fmt.Printf(`{"cniVersion":%q,"code":999,"msg":"fake agent unavailable"}`, c.CNIVersion)
			return 1
		}
		// Record what the plugin saw, for the test to check.
		_ = os.WriteFile(c.Gate+".args", []byte(os.Getenv("CNI_ARGS")+"\n"+os.Getenv("CNI_NETNS")), 0o644)
		os.Stdout.Write(c.PrevResult)
	case "VERSION":
		fmt.Print(`{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}`)
	}
	return 0
}

// fakePluginDir returns a directory holding fakePluginName (this binary).
func fakePluginDir(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(self, filepath.Join(dir, fakePluginName)); err != nil {
		t.Fatal(err)
	}
	return dir
}
