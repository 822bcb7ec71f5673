package main

import (
	"fmt"
	"io"

	"github.com/ztunnel-go/ztunnel-go/internal/daemon"
)

// runVersion prints the release stamped into zctl at link time (make build,
// the zctl image), as the daemons' -version does.
func runVersion(args []string, out io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version takes no arguments, got %q", args)
	}
	_, err := fmt.Fprintln(out, "zctl", daemon.Version())
	return err
}
