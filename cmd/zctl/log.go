package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// defaultScope is the only log scope: zap has one level per process here.
const defaultScope = "default"

const logAbout = `Reads the node proxy's log level (its admin /logging) or sets it. ztunnel-go
has ONE level per process: its named loggers (xds, proxy, dns, inpod, access,
...) all share it, so the only scope is "default". --level LEVEL and
--level default:LEVEL set it (debug, info, warn or error); any other scope is
refused rather than pretending to set it. --reset restores the level the
process started with. The same works on ztunnel-cp (--admin localhost:15014)
and the node agent.`

// logLevel is what zctl log prints.
type logLevel struct {
	Proxy  string            `json:"proxy"`
	Level  string            `json:"level"`
	Scopes map[string]string `json:"scopes"` // always just defaultScope
}

func runLog(args []string, out io.Writer) error {
	var addr, format, level string
	var reset bool
	s := newSub("log", "", logAbout, out)
	s.fs.StringVar(&addr, "admin", defaultNodeAdmin, "the node proxy's (ztunnel ADMIN) admin address")
	s.fs.StringVar(&level, "level", "", "set the level: LEVEL or default:LEVEL (the only scope)")
	s.fs.BoolVar(&reset, "reset", false, "restore the level the process started with")
	s.format(&format)
	pos, err := s.parse(args, &format)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		s.fs.Usage()
		return fmt.Errorf("log takes no arguments, got %q (did you mean --level %s?)", pos, pos[0])
	}
	method, query := http.MethodGet, ""
	switch {
	case reset && level != "":
		return fmt.Errorf("--reset and --level are exclusive")
	case reset:
		method, query = http.MethodPost, "?reset"
	case level != "":
		lvl, err := parseLevelFlag(level)
		if err != nil {
			return err
		}
		method, query = http.MethodPost, "?level="+url.QueryEscape(lvl)
	}
	b, from, err := adminRequest(method, addr, "/logging"+query, "is the proxy running, and is --admin right?")
	if err != nil {
		return err
	}
	// The handler answers "current log level is <level>".
	cur, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "current log level is ")
	if !ok {
		return fmt.Errorf("%s %s: unexpected answer %q", method, from, b)
	}
	l := logLevel{Proxy: "admin " + strings.TrimSuffix(from, query), Level: cur, Scopes: map[string]string{defaultScope: cur}}
	return writeData(out, format, l, func() error {
		_, err := fmt.Fprintf(out, "# proxy: %s\nSCOPE    LEVEL\n%-8s %s\n(one level per process: every named logger uses it)\n", l.Proxy, defaultScope, cur)
		return err
	})
}

// parseLevelFlag accepts LEVEL, default:LEVEL, or a comma list of those
// naming one level, and refuses any other scope.
func parseLevelFlag(v string) (string, error) {
	level := ""
	for part := range strings.SplitSeq(v, ",") {
		scope, lvl, scoped := strings.Cut(strings.TrimSpace(part), ":")
		if !scoped {
			scope, lvl = defaultScope, scope
		}
		if scope != defaultScope {
			return "", fmt.Errorf("log scope %q has no level of its own: ztunnel-go has one log level per process, "+
				"shared by every named logger; set it with --level %s or --level %s:%s", scope, or(lvl, "LEVEL"), defaultScope, or(lvl, "LEVEL"))
		}
		if lvl == "" {
			return "", fmt.Errorf("--level %q: no level (want debug, info, warn or error)", part)
		}
		if level != "" && level != lvl {
			return "", fmt.Errorf("--level %q names two levels (%s and %s) for the one scope", v, level, lvl)
		}
		level = lvl
	}
	return level, nil
}
