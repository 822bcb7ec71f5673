package rules

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Applier makes a network namespace's capture rules match a RuleSet. Calls
// on one namespace must not run concurrently (the agent handles a pod's
// events in order); calls on different namespaces may.
type Applier interface {
	// Apply converges the namespace to rs and is idempotent: the owned
	// chains end up holding exactly rs's rules in order (a chain that
	// differs is flushed and refilled; one that matches is not touched),
	// each jump exists once in its built-in chain (inserted first), owned
	// chains rs leaves empty are deleted, and rs's ip rules and routes
	// exist. Rules outside the owned chains are never touched. The
	// iptables changes of each table are one iptables-restore transaction,
	// so a live pod never sees a flushed chain (repair is atomic).
	Apply(rs RuleSet) error
	// Check reports how the namespace differs from rs without changing it;
	// an empty Diff means Apply would do nothing.
	Check(rs RuleSet) (Diff, error)
	// Remove deletes everything rs owns: its chains, the jumps into them,
	// and its ip rules and routes. Only rs.Owned, rs.IPRules and rs.Routes
	// are consulted, so pass a set built with the same IPv6 setting as the
	// one applied.
	Remove(rs RuleSet) error
}

// Diff is the difference between a namespace and a RuleSet.
type Diff struct {
	// Missing are desired rules (including jumps) that are absent.
	Missing []Rule
	// Extra are rules in owned chains, or jumps into owned chains, that rs
	// does not want (duplicates count).
	Extra []Rule
	// Misordered are owned chains holding the desired rules in another order.
	Misordered []ChainRef
	// Stale are owned chains that exist although rs puts nothing in them.
	Stale []ChainRef
	// MissingIPRules and MissingRoutes are policy routing items that are absent.
	MissingIPRules []IPRule
	MissingRoutes  []LocalRoute
}

// Empty reports whether there is no difference.
func (d Diff) Empty() bool {
	return len(d.Missing)+len(d.Extra)+len(d.Misordered)+len(d.Stale)+
		len(d.MissingIPRules)+len(d.MissingRoutes) == 0
}

// String lists the differences one per line: "+" missing, "-" extra,
// "~" misordered chain, "x" stale chain.
func (d Diff) String() string {
	var b strings.Builder
	for _, r := range d.Missing {
		fmt.Fprintf(&b, "+ %s\n", r)
	}
	for _, r := range d.Extra {
		fmt.Fprintf(&b, "- %s\n", r)
	}
	for _, c := range d.Misordered {
		fmt.Fprintf(&b, "~ %s\n", c)
	}
	for _, c := range d.Stale {
		fmt.Fprintf(&b, "x %s\n", c)
	}
	for _, r := range d.MissingIPRules {
		fmt.Fprintf(&b, "+ %s\n", r)
	}
	for _, r := range d.MissingRoutes {
		fmt.Fprintf(&b, "+ %s\n", r)
	}
	return b.String()
}

// iptables is the per-family seam to the kernel: reading through
// *github.com/coreos/go-iptables/iptables.IPTables (List returns
// `iptables -S CHAIN` lines), writing through iptables-restore; FakeTables
// implements it in memory.
type iptables interface {
	ListChains(table string) ([]string, error)
	List(table, chain string) ([]string, error)
	// Restore runs lines (iptables-restore commands without the "*table"
	// header and COMMIT: ":CHAIN - [0:0]", "-F CHAIN", "-A ...", "-I CHAIN
	// 1 ...", "-D ...", "-X CHAIN") against table as one transaction with
	// --noflush: either all of them take effect at once or none does, so a
	// live pod never sees a chain half refilled.
	Restore(table string, lines []string) error
}

// routing is the seam for the policy routing items.
type routing interface {
	HasIPRule(IPRule) (bool, error)
	AddIPRule(IPRule) error
	DelIPRule(IPRule) error // no error if absent
	HasRoute(LocalRoute) (bool, error)
	AddRoute(LocalRoute) error
	DelRoute(LocalRoute) error // no error if absent
}

// engine implements Applier over the seams. It holds no state between
// calls: every call reads the namespace afresh.
type engine struct {
	tables  func(Family) (iptables, error)
	routing func() (routing, func(), error) // returns a release func
	// do runs fn where the seams act (inside the pod netns).
	do func(fn func() error) error
}

func (e *engine) Apply(rs RuleSet) error {
	return e.do(func() error { return e.apply(rs) })
}

func (e *engine) Check(rs RuleSet) (Diff, error) {
	var d Diff
	err := e.do(func() error {
		var err error
		d, err = e.diff(rs)
		return err
	})
	return d, err
}

func (e *engine) Remove(rs RuleSet) error {
	return e.do(func() error {
		if err := e.apply(RuleSet{Owned: rs.Owned}); err != nil {
			return err
		}
		rt, release, err := e.routing()
		if err != nil {
			return err
		}
		defer release()
		var errs []error
		for _, r := range rs.IPRules {
			errs = append(errs, rt.DelIPRule(r))
		}
		for _, r := range rs.Routes {
			errs = append(errs, rt.DelRoute(r))
		}
		return errors.Join(errs...)
	})
}

// chainState is what one owned chain currently holds.
type chainState struct {
	exists bool
	rules  []string // specs, in order
	jumps  []Rule   // rules in built-in chains jumping here
}

func (e *engine) read(rs RuleSet) (map[ChainRef]*chainState, error) {
	state := make(map[ChainRef]*chainState)
	for _, f := range rs.Families() {
		ipt, err := e.tables(f)
		if err != nil {
			return nil, err
		}
		for _, table := range ownedTables(rs, f) {
			chains, err := ipt.ListChains(table)
			if err != nil {
				return nil, fmt.Errorf("rules: %s list chains of %s: %w", f, table, err)
			}
			owned := make(map[string]*chainState)
			for _, c := range rs.Owned {
				if c.Family == f && c.Table == table {
					st := &chainState{exists: slices.Contains(chains, c.Chain)}
					state[c], owned[c.Chain] = st, st
				}
			}
			for _, chain := range chains {
				st, isOwned := owned[chain]
				if !isOwned && !isBuiltin(table, chain) {
					continue
				}
				lines, err := ipt.List(table, chain)
				if err != nil {
					return nil, fmt.Errorf("rules: %s list %s %s: %w", f, table, chain, err)
				}
				for _, line := range lines {
					spec, ok := strings.CutPrefix(line, "-A "+chain+" ")
					if !ok {
						continue
					}
					if isOwned {
						st.rules = append(st.rules, spec)
						continue
					}
					args := strings.Fields(spec)
					if n := len(args); n >= 2 && args[n-2] == "-j" && owned[args[n-1]] != nil {
						target := owned[args[n-1]]
						target.jumps = append(target.jumps, Rule{f, table, chain, args})
					}
				}
			}
		}
	}
	return state, nil
}

func ownedTables(rs RuleSet, f Family) []string {
	var out []string
	for _, c := range rs.Owned {
		if c.Family == f && !slices.Contains(out, c.Table) {
			out = append(out, c.Table)
		}
	}
	return out
}

// desired splits rs.Rules of an owned chain into its own rules and the jumps
// into it.
func desired(rs RuleSet, c ChainRef) (rules []string, jumps []Rule) {
	for _, r := range rs.Rules {
		switch {
		case r.Ref() == c:
			rules = append(rules, r.Spec())
		case r.Family == c.Family && r.Table == c.Table && isBuiltin(r.Table, r.Chain) &&
			len(r.Args) >= 2 && r.Args[len(r.Args)-2] == "-j" && r.Args[len(r.Args)-1] == c.Chain:
			jumps = append(jumps, r)
		}
	}
	return rules, jumps
}

func (e *engine) diff(rs RuleSet) (Diff, error) {
	if err := validateOwnership(rs); err != nil {
		return Diff{}, err
	}
	state, err := e.read(rs)
	if err != nil {
		return Diff{}, err
	}
	var d Diff
	for _, c := range rs.Owned {
		st := state[c]
		want, wantJumps := desired(rs, c)
		if len(want) == 0 && len(wantJumps) == 0 {
			if st.exists {
				d.Stale = append(d.Stale, c)
			}
		}
		missing, extra := multisetDiff(want, st.rules)
		for _, s := range missing {
			d.Missing = append(d.Missing, Rule{c.Family, c.Table, c.Chain, strings.Fields(s)})
		}
		for _, s := range extra {
			d.Extra = append(d.Extra, Rule{c.Family, c.Table, c.Chain, strings.Fields(s)})
		}
		if len(missing) == 0 && len(extra) == 0 && !slices.Equal(want, st.rules) {
			d.Misordered = append(d.Misordered, c)
		}
		jm, je := multisetDiff(ruleKeys(wantJumps), ruleKeys(st.jumps))
		d.Missing = append(d.Missing, keysToRules(c, jm)...)
		d.Extra = append(d.Extra, keysToRules(c, je)...)
	}
	if len(rs.IPRules)+len(rs.Routes) == 0 {
		return d, nil
	}
	rt, release, err := e.routing()
	if err != nil {
		return Diff{}, err
	}
	defer release()
	for _, r := range rs.IPRules {
		ok, err := rt.HasIPRule(r)
		if err != nil {
			return Diff{}, err
		}
		if !ok {
			d.MissingIPRules = append(d.MissingIPRules, r)
		}
	}
	for _, r := range rs.Routes {
		ok, err := rt.HasRoute(r)
		if err != nil {
			return Diff{}, err
		}
		if !ok {
			d.MissingRoutes = append(d.MissingRoutes, r)
		}
	}
	return d, nil
}

// ruleKeys keys built-in-chain rules as "CHAIN spec".
func ruleKeys(rs []Rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Chain + " " + r.Spec()
	}
	return out
}

func keysToRules(c ChainRef, keys []string) []Rule {
	var out []Rule
	for _, k := range keys {
		f := strings.Fields(k)
		out = append(out, Rule{c.Family, c.Table, f[0], f[1:]})
	}
	return out
}

// multisetDiff returns want−have and have−want, counting duplicates.
func multisetDiff(want, have []string) (missing, extra []string) {
	count := make(map[string]int)
	for _, h := range have {
		count[h]++
	}
	for _, w := range want {
		if count[w] > 0 {
			count[w]--
		} else {
			missing = append(missing, w)
		}
	}
	for _, h := range have {
		if count[h] > 0 {
			count[h]--
			extra = append(extra, h)
		}
	}
	return missing, extra
}

// validateOwnership rejects rule sets whose rules fall outside the owned
// chains (a jump counts as inside when its target is owned).
func validateOwnership(rs RuleSet) error {
	for _, r := range rs.Rules {
		owned := slices.Contains(rs.Owned, r.Ref())
		if !owned && isBuiltin(r.Table, r.Chain) && len(r.Args) == 2 && r.Args[0] == "-j" {
			owned = slices.Contains(rs.Owned, ChainRef{r.Family, r.Table, r.Args[1]})
		}
		if !owned {
			return fmt.Errorf("rules: rule %q is outside the owned chains", r)
		}
	}
	return nil
}

// apply converges to rs using the diff: each step is skipped when already
// true, so applying a converged namespace writes nothing. All iptables
// changes of one table go into one iptables-restore transaction (rewritten
// chains are declared and flushed inside it, then refilled; then jumps;
// then stale chains are deleted), so no packet ever meets a chain that is
// flushed but not yet refilled.
func (e *engine) apply(rs RuleSet) error {
	d, err := e.diff(rs)
	if err != nil || d.Empty() {
		return err
	}
	rewrite := make(map[ChainRef]bool)
	for _, r := range append(slices.Clone(d.Missing), d.Extra...) {
		if !isBuiltin(r.Table, r.Chain) {
			rewrite[r.Ref()] = true
		}
	}
	for _, c := range d.Misordered {
		rewrite[c] = true
	}
	type tableRef struct {
		fam   Family
		table string
	}
	var order []tableRef
	txn := make(map[tableRef][]string)
	add := func(f Family, table string, line string) {
		k := tableRef{f, table}
		if _, ok := txn[k]; !ok {
			order = append(order, k)
		}
		txn[k] = append(txn[k], line)
	}
	// 1. owned chains: declare (creates a missing one), flush, refill.
	for _, c := range rs.Owned {
		if rewrite[c] && !slices.Contains(d.Stale, c) {
			add(c.Family, c.Table, ":"+c.Chain+" - [0:0]")
		}
	}
	for _, c := range rs.Owned {
		if !rewrite[c] || slices.Contains(d.Stale, c) {
			continue
		}
		add(c.Family, c.Table, "-F "+c.Chain)
		want, _ := desired(rs, c)
		for _, spec := range want {
			add(c.Family, c.Table, restoreLine("-A", c.Chain, strings.Fields(spec)))
		}
	}
	// 2. jumps: drop unwanted ones first, then insert missing ones at the top.
	for _, r := range d.Extra {
		if isBuiltin(r.Table, r.Chain) {
			add(r.Family, r.Table, restoreLine("-D", r.Chain, r.Args))
		}
	}
	for _, r := range d.Missing {
		if isBuiltin(r.Table, r.Chain) {
			add(r.Family, r.Table, restoreLine("-I", r.Chain+" 1", r.Args))
		}
	}
	// 3. stale chains, unreferenced once the lines above took effect.
	for _, c := range d.Stale {
		add(c.Family, c.Table, "-F "+c.Chain)
		add(c.Family, c.Table, "-X "+c.Chain)
	}
	for _, k := range order {
		ipt, err := e.tables(k.fam)
		if err != nil {
			return err
		}
		if err := ipt.Restore(k.table, txn[k]); err != nil {
			return fmt.Errorf("rules: %s %s: %w", k.fam, k.table, err)
		}
	}
	// 4. policy routing.
	if len(d.MissingIPRules)+len(d.MissingRoutes) == 0 {
		return nil
	}
	rt, release, err := e.routing()
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
	return nil
}

// restoreLine is one iptables-restore command: op chain args, with args
// holding whitespace or quotes quoted.
func restoreLine(op, chain string, args []string) string {
	var b strings.Builder
	b.WriteString(op + " " + chain)
	for _, a := range args {
		b.WriteByte(' ')
		if a == "" || strings.ContainsAny(a, " \t\"'") {
			b.WriteString(strconv.Quote(a))
			continue
		}
		b.WriteString(a)
	}
	return b.String()
}
