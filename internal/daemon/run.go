package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"go.uber.org/zap"
)

// SignalContext is cancelled on SIGTERM or SIGINT (a pod's stop, ^C).
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
}

// ErrVersion is what a daemon's flag parsing returns when -version was
// given (VersionFlag): ExitOnFlagError prints the version then.
var ErrVersion = errors.New("version requested")

// VersionFlag registers -version on fs. After fs.Parse, a true value means
// the caller returns ErrVersion before validating anything else.
func VersionFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("version", false, "print the release this binary was built as and exit")
}

// ExitOnFlagError ends the process for a flag-parsing error of binary name:
// 0 for -h/--help (usage is printed already) and for -version (ErrVersion:
// "<name> <version>" is printed on stdout), else the error and exit code
// 2. It returns when err is nil.
func ExitOnFlagError(name string, err error) {
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if errors.Is(err, ErrVersion) {
		fmt.Println(name, Version())
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
}

// PrintCheck writes what a --check-flags run prints: v as one JSON object
// and a newline.
func PrintCheck(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// Exit ends a daemon after its run returned err: logged at error level
// with exit code 1, or a "stopped" line and exit code 0 when nil.
func Exit(log *zap.Logger, name string, err error) {
	code := 0
	var te *TaskError
	switch {
	case errors.As(err, &te):
		// The Group logged the error when it happened; name the task only.
		log.Error(name+" failed", zap.String("task", te.Task))
		code = 1
	case err != nil:
		log.Error(name+" failed", zap.Error(err))
		code = 1
	default:
		log.Info(name + " stopped")
	}
	_ = log.Sync()
	os.Exit(code)
}

// version is the release, stamped at link time from the VERSION file
// (make build and hack/images pass
// -ldflags=-X github.com/ztunnel-go/ztunnel-go/internal/daemon.version=...):
// a build of the main module's own tree has no module version, only
// "(devel)".
var version string

// Version is the stamped version, else the main module's version from the
// build information ("(devel)" for a tree built in place), else
// "unknown".
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "unknown"
}
