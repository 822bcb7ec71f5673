package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"sigs.k8s.io/yaml"
)

// Default admin addresses (the binaries' own defaults; tests compare them).
const (
	defaultNodeAdmin = "localhost:15000" // ztunnel --admin
	defaultCPAdmin   = "localhost:15014" // ztunnel-cp --admin
)

// subcommand is a command with its own flags, parsed by runSub.
type subcommand struct {
	fs       *flag.FlagSet
	synopsis string
	out      io.Writer
}

// newSub starts the flag set of command name; its usage prints on out.
func newSub(name, synopsis, about string, out io.Writer) *subcommand {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: zctl %s [flags] %s\n\n%s\n\nflags:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return &subcommand{fs: fs, synopsis: synopsis, out: out}
}

// source adds --<adminFlag> ADDR and -f/--file FILE to s.
func (s *subcommand) source(adminFlag, def, what string, addr, file *string) {
	s.fs.StringVar(addr, adminFlag, def, what+" admin address")
	s.fs.StringVar(file, "file", "", "read a saved copy of the endpoint's JSON instead of asking")
	s.fs.StringVar(file, "f", "", "short for --file")
}

// format adds -o table|json|yaml to s.
func (s *subcommand) format(o *string) {
	s.fs.StringVar(o, "o", "table", "output format: table, json or yaml")
}

// parse parses args (flags anywhere) and checks the output format, if any.
func (s *subcommand) parse(args []string, format *string) ([]string, error) {
	pos, err := parseInterspersed(s.fs, args)
	if err != nil {
		return nil, err
	}
	if format != nil {
		switch *format {
		case "table", "json", "yaml":
		default:
			return nil, fmt.Errorf("unknown output format %q (want table, json or yaml)", *format)
		}
	}
	return pos, nil
}

// adminRequest sends method path to an admin server at addr and returns the
// body of a 200 answer, and the URL it asked (to say what it read).
func adminRequest(method, addr, path, hint string) ([]byte, string, error) {
	url := "http://" + addr + path
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, url, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, url, fmt.Errorf("%w (%s)", err, hint)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, url, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, url, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, b)
	}
	return b, url, nil
}

// readSource decodes the JSON of GET path at addr, or of the saved file,
// into v and says which one it read.
func readSource(addr, file, path, hint string, v any) (string, error) {
	var (
		b    []byte
		from string
		err  error
	)
	if file != "" {
		from = "file " + file
		b, err = os.ReadFile(file)
	} else {
		b, from, err = adminRequest(http.MethodGet, addr, path, hint)
		from = "admin " + from
	}
	if err != nil {
		return from, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return from, fmt.Errorf("decoding %s: %w", from, err)
	}
	return from, nil
}

// writeData prints v as JSON or YAML; for "table" it calls table.
func writeData(w io.Writer, format string, v any, table func() error) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		return table()
	}
}

// age prints how long ago t was, to the second ("-" for the zero time).
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Truncate(time.Second).String()
}
