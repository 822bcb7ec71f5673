// Command zctl explains what a node proxy is doing, from its admin
// config dump:
//
//	zctl config-dump [--admin localhost:15000] [--file dump.json] [workloads|services|policies|certificates|pods]
//	zctl check [--admin localhost:15000] [--file dump.json] <src-workload> <dst-ip:port>
//
// config-dump prints the node's state as tables. check rebuilds the state
// offline and runs the data path's own routing decision (route.Outbound) and
// L4 authorization (rbac.Evaluate) on it, to show how a connection from
// <src-workload> (uid, namespace/name or IP) to <dst> would leave the pod
// and whether the destination would allow it; it exits 3 on a deny.
//
// It only reads; it never changes the proxy.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"time"
)

func main() {
	err := run(os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, errDenied):
		os.Exit(3)
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "zctl:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage:
  zctl config-dump [--admin localhost:15000] [--file dump.json] [workloads|services|policies|certificates|pods]
  zctl check [--admin localhost:15000] [--file dump.json] <src-workload> <dst-ip:port>`)
}

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		usage(os.Stderr)
		return errors.New("no command")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	admin := fs.String("admin", "localhost:15000", "the node proxy's admin address")
	file := fs.String("file", "", "read a saved config dump instead of asking the proxy")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	d, err := load(*admin, *file)
	if err != nil {
		return err
	}
	switch args[0] {
	case "config-dump":
		sections := sectionNames()
		if fs.NArg() > 0 {
			sections = fs.Args()
		}
		for i, s := range sections {
			if len(sections) > 1 {
				if i > 0 {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "== %s (generation %d)\n", s, d.Generation)
			}
			if err := render(out, d, s); err != nil {
				return err
			}
		}
		return nil
	case "check":
		if fs.NArg() != 2 {
			return errors.New("check wants <src-workload> <dst-ip:port>")
		}
		dst, err := netip.ParseAddrPort(fs.Arg(1))
		if err != nil {
			return fmt.Errorf("destination: %w", err)
		}
		return check(out, d, fs.Arg(0), dst)
	}
	usage(os.Stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

// load fetches /config_dump from the admin server, or reads file.
func load(admin, file string) (*dump, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		return parseDump(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/config_dump", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w (is the node proxy running, and is --admin right?)", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /config_dump: %s: %s", resp.Status, b)
	}
	return parseDump(b)
}
