package rules

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel-go/internal/netns"
)

// NFTConfig configures NewNFTApplier.
type NFTConfig struct {
	// Netns is the namespace to act in. nil means the calling thread's.
	Netns *netns.Handle
	// MigrateFrom lists the iptables variants whose chains of the RuleSet
	// (ISTIO_PRERT, ISTIO_OUTPUT, ... and the jumps into them) an earlier
	// iptables-backed agent may have left: Apply removes them once the
	// nftables tables are in, Check reports them, Remove deletes them too.
	// Pass the variant DetectMode finds; nil leaves iptables alone.
	MigrateFrom []Mode
}

// NewNFTApplier returns an Applier that keeps a namespace's capture rules in
// native nftables (the inet tables of NFTables), shelling out to the `nft`
// binary (Debian package nftables) inside cfg.Netns: every change is one
// `nft -f -` script, one kernel transaction. Policy routing is the same
// netlink code as the iptables applier's. The RuleSet is the one InPod
// returns, so callers choose a backend without building rules differently.
//
// HostProbe's rule set (ipset and socket owner matches) has no translation
// here; NFTHost is the nftables host side.
func NewNFTApplier(cfg NFTConfig) Applier {
	a := &nftApplier{do: cfg.Netns.Do, nft: &nftBinary{}}
	for _, m := range cfg.MigrateFrom {
		km := &kernel{mode: m, ipt: make(map[Family]*kernelTables)}
		a.legacy = append(a.legacy, legacyTables{mode: m, engine: &engine{
			tables:  km.tables,
			routing: func() (routing, func(), error) { return nil, nil, errors.New("rules: no routing in migration") },
			do:      func(fn func() error) error { return fn() },
		}})
	}
	a.routing = func() (routing, func(), error) {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return nil, nil, fmt.Errorf("rules: netlink: %w", err)
		}
		return netlinkRouting{h}, h.Close, nil
	}
	return a
}

// nftRunner is the seam to nft: List returns `nft list table inet NAME`
// (ok false when the table does not exist), Tables the names of the inet
// tables (one exec), Run feeds a script to `nft -f -`.
type nftRunner interface {
	List(table string) (listing string, ok bool, err error)
	Tables() ([]string, error)
	Run(script string) error
}

// legacyTables is one iptables variant an earlier agent may have used.
type legacyTables struct {
	mode   Mode
	engine *engine // runs in the calling thread: the nft applier entered the netns
}

type nftApplier struct {
	do      func(fn func() error) error
	nft     nftRunner
	routing func() (routing, func(), error)
	legacy  []legacyTables
}

func (a *nftApplier) Apply(rs RuleSet) error {
	return a.do(func() error { return a.apply(rs) })
}

func (a *nftApplier) Check(rs RuleSet) (Diff, error) {
	var d Diff
	err := a.do(func() error {
		var err error
		d, _, _, _, err = a.diff(rs)
		if err != nil {
			return err
		}
		// iptables chains left by an earlier agent: Apply would remove them.
		for _, l := range a.legacy {
			ld, err := l.diff(rs)
			if err != nil {
				return err
			}
			d.Extra = append(d.Extra, ld.Extra...)
			d.Stale = append(d.Stale, ld.Stale...)
		}
		return nil
	})
	return d, err
}

func (a *nftApplier) Remove(rs RuleSet) error {
	return a.do(func() error {
		var errs []error
		var script strings.Builder
		for _, name := range NFTOwnedTables(rs) {
			fmt.Fprintf(&script, "add table inet %s\ndelete table inet %s\n", name, name)
		}
		if script.Len() > 0 {
			errs = append(errs, a.nft.Run(script.String()))
		}
		for _, l := range a.legacy {
			errs = append(errs, l.remove(rs))
		}
		rt, release, err := a.routing()
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		defer release()
		for _, r := range rs.IPRules {
			errs = append(errs, rt.DelIPRule(r))
		}
		for _, r := range rs.Routes {
			errs = append(errs, rt.DelRoute(r))
		}
		return errors.Join(errs...)
	})
}

// diff reads the owned tables and compares them with rs's translation and
// rs's policy routing.
func (a *nftApplier) diff(rs RuleSet) (d Diff, want []NFTTable, have map[string]NFTTable, rewrite []string, err error) {
	want, err = NFTables(rs)
	if err != nil {
		return Diff{}, nil, nil, nil, err
	}
	have = map[string]NFTTable{}
	owned := NFTOwnedTables(rs)
	for _, name := range owned {
		listing, ok, err := a.nft.List(name)
		if err != nil {
			return Diff{}, nil, nil, nil, err
		}
		if !ok {
			continue
		}
		t, err := parseNFTTable(listing)
		if err != nil {
			return Diff{}, nil, nil, nil, err
		}
		have[name] = t
	}
	d, rewrite = diffNFT(owned, have, want)
	if len(rs.IPRules)+len(rs.Routes) == 0 {
		return d, want, have, rewrite, nil
	}
	rt, release, err := a.routing()
	if err != nil {
		return Diff{}, nil, nil, nil, err
	}
	defer release()
	for _, r := range rs.IPRules {
		ok, err := rt.HasIPRule(r)
		if err != nil {
			return Diff{}, nil, nil, nil, err
		}
		if !ok {
			d.MissingIPRules = append(d.MissingIPRules, r)
		}
	}
	for _, r := range rs.Routes {
		ok, err := rt.HasRoute(r)
		if err != nil {
			return Diff{}, nil, nil, nil, err
		}
		if !ok {
			d.MissingRoutes = append(d.MissingRoutes, r)
		}
	}
	return d, want, have, rewrite, nil
}

// apply converges the nftables tables and policy routing to rs, and only
// then removes what an iptables-backed agent left.
//
// The order is what makes the migration safe: while both backends' rules
// are in, a packet passes both, and since they are the same rules at the
// same hook priorities the result is the same (the first NAT redirect binds
// the connection, a second one at the same hook is not evaluated; marks and
// conntrack zones are set to the same values twice). Removing the iptables
// rules first would leave the pod's new connections uncaptured until the
// nft script ran; installing nft first leaves no such window, and a failed
// nft script leaves the iptables rules capturing.
func (a *nftApplier) apply(rs RuleSet) error {
	d, want, have, rewrite, err := a.diff(rs)
	if err != nil {
		return err
	}
	if len(rewrite) > 0 {
		if err := a.nft.Run(nftScript(rewrite, have, want)); err != nil {
			return err
		}
	}
	if len(d.MissingIPRules)+len(d.MissingRoutes) > 0 {
		rt, release, err := a.routing()
		if err != nil {
			return err
		}
		defer release()
		for _, r := range d.MissingIPRules {
			if err := rt.AddIPRule(r); err != nil {
				return fmt.Errorf("rules: %s: %w", r, err)
			}
		}
		for _, r := range d.MissingRoutes {
			if err := rt.AddRoute(r); err != nil {
				return fmt.Errorf("rules: %s: %w", r, err)
			}
		}
	}
	for _, l := range a.legacy {
		if err := l.remove(rs); err != nil {
			return fmt.Errorf("rules: migrating from iptables (%s): %w", l.mode, err)
		}
	}
	return nil
}

// present reports whether the variant holds any ISTIO_ chain in the
// namespace, reading `<variant>-save` once per family: cheap, without side
// effects (listing a legacy table with `iptables -t nat -S` would create
// it), and false when the variant's binaries are not installed, since then
// no agent can have written rules with them.
func (l legacyTables) present(rs RuleSet) (bool, error) {
	for _, f := range rs.Families() {
		bin := l.mode.binary(f) + "-save"
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			return false, fmt.Errorf("rules: %s: %w", bin, err)
		}
		for _, c := range rs.Owned {
			if c.Family == f && bytes.Contains(out, []byte(":"+c.Chain+" ")) {
				return true, nil
			}
		}
	}
	return false, nil
}

// diff is what removing the variant's chains would change.
func (l legacyTables) diff(rs RuleSet) (Diff, error) {
	if ok, err := l.present(rs); err != nil || !ok {
		return Diff{}, err
	}
	return l.engine.diff(RuleSet{Owned: rs.Owned})
}

// remove deletes the variant's owned chains and jumps (not the policy
// routing, which the nft rules use too).
func (l legacyTables) remove(rs RuleSet) error {
	if ok, err := l.present(rs); err != nil || !ok {
		return err
	}
	return l.engine.apply(RuleSet{Owned: rs.Owned})
}

// nftBinary runs the nft binary, looked up on first use.
type nftBinary struct {
	once sync.Once
	path string
	err  error
}

// errNoNFT is wrapped by nftBinary's errors when nft is not installed.
var errNoNFT = errors.New("rules: nft not found (Debian package nftables)")

func (n *nftBinary) bin() (string, error) {
	n.once.Do(func() {
		n.path, n.err = exec.LookPath("nft")
		if n.err != nil {
			n.err = fmt.Errorf("%w: %w", errNoNFT, n.err)
		}
	})
	return n.path, n.err
}

func (n *nftBinary) List(table string) (string, bool, error) {
	bin, err := n.bin()
	if err != nil {
		return "", false, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "list", "table", "inet", table)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "No such file or directory") {
			return "", false, nil
		}
		return "", false, fmt.Errorf("rules: nft list table inet %s: %w: %s", table, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), true, nil
}

func (n *nftBinary) Tables() ([]string, error) {
	bin, err := n.bin()
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(bin, "list", "tables", "inet").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("rules: nft list tables: %w: %s", err, bytes.TrimSpace(out))
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "table inet "); ok {
			names = append(names, name)
		}
	}
	return names, nil
}

func (n *nftBinary) Run(script string) error {
	bin, err := n.bin()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("rules: nft -f: %w: %s (input:\n%s)", err, bytes.TrimSpace(out), script)
	}
	return nil
}

// fromNFT is the iptables applier of an agent switched back from nftables:
// it removes the nftables tables an nftables-backed agent left, after its
// own rules are in (the same ordering as the nftables applier's, for the
// same reason), so a pod later removed from the mesh is not still captured
// by forgotten tables.
type fromNFT struct {
	*engine
	nft nftRunner
}

// leftover lists the owned nftables tables present in the namespace.
func (f *fromNFT) leftover(rs RuleSet) ([]string, error) {
	tables, err := f.nft.Tables()
	if errors.Is(err, errNoNFT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range NFTOwnedTables(rs) {
		if slices.Contains(tables, name) {
			out = append(out, name)
		}
	}
	return out, nil
}

func (f *fromNFT) deleteLeftover(rs RuleSet) error {
	names, err := f.leftover(rs)
	if err != nil || len(names) == 0 {
		return err
	}
	var script strings.Builder
	for _, name := range names {
		fmt.Fprintf(&script, "delete table inet %s\n", name)
	}
	return f.nft.Run(script.String())
}

func (f *fromNFT) Apply(rs RuleSet) error {
	return f.do(func() error {
		if err := f.apply(rs); err != nil {
			return err
		}
		if err := f.deleteLeftover(rs); err != nil {
			return fmt.Errorf("rules: migrating from nftables: %w", err)
		}
		return nil
	})
}

func (f *fromNFT) Check(rs RuleSet) (Diff, error) {
	d, err := f.engine.Check(rs)
	if err != nil {
		return d, err
	}
	err = f.do(func() error {
		names, err := f.leftover(rs)
		for _, name := range names {
			d.Stale = append(d.Stale, ChainRef{Table: "inet " + name})
		}
		return err
	})
	return d, err
}

func (f *fromNFT) Remove(rs RuleSet) error {
	err := f.engine.Remove(rs)
	return errors.Join(err, f.do(func() error { return f.deleteLeftover(rs) }))
}
