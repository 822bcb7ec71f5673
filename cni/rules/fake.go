package rules

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Fake is an in-memory Applier for unit tests, here and in the CNI agent. It
// runs the same convergence logic as the kernel Applier over FakeTables (one
// per family, keyed by table and chain) and an in-memory routing table, and
// behaves like iptables where it matters: appending to a missing chain,
// jumping to a missing chain, deleting a missing rule and deleting a
// referenced or non-empty chain are errors.
type Fake struct {
	engine
	mu      sync.Mutex
	fams    map[Family]*FakeTables
	ipRules []IPRule
	routes  []LocalRoute
}

// NewFake returns an empty namespace (built-in chains only).
func NewFake() *Fake {
	f := &Fake{fams: map[Family]*FakeTables{IPv4: NewFakeTables(), IPv6: NewFakeTables()}}
	f.engine = engine{
		tables: func(fam Family) (iptables, error) {
			t, ok := f.fams[fam]
			if !ok {
				return nil, fmt.Errorf("rules: fake: no family %s", fam)
			}
			return t, nil
		},
		routing: func() (routing, func(), error) { return fakeRouting{f}, func() {}, nil },
		do:      func(fn func() error) error { return fn() },
	}
	return f
}

// Tables returns the fake iptables of family f, to inspect or to inject drift.
func (f *Fake) Tables(fam Family) *FakeTables { return f.fams[fam] }

// IPRules and Routes return copies of the policy routing state.
func (f *Fake) IPRules() []IPRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ipRules)
}

func (f *Fake) Routes() []LocalRoute {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.routes)
}

type fakeRouting struct{ f *Fake }

func (r fakeRouting) HasIPRule(x IPRule) (bool, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return slices.Contains(r.f.ipRules, x), nil
}

func (r fakeRouting) AddIPRule(x IPRule) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	r.f.ipRules = append(r.f.ipRules, x)
	return nil
}

func (r fakeRouting) DelIPRule(x IPRule) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	r.f.ipRules = slices.DeleteFunc(r.f.ipRules, func(y IPRule) bool { return y == x })
	return nil
}

func (r fakeRouting) HasRoute(x LocalRoute) (bool, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	return slices.Contains(r.f.routes, x), nil
}

func (r fakeRouting) AddRoute(x LocalRoute) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if slices.Contains(r.f.routes, x) {
		return fmt.Errorf("fake: route %s exists", x)
	}
	r.f.routes = append(r.f.routes, x)
	return nil
}

func (r fakeRouting) DelRoute(x LocalRoute) error {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	r.f.routes = slices.DeleteFunc(r.f.routes, func(y LocalRoute) bool { return y == x })
	return nil
}

// FakeTables is one family's iptables in memory: table → chain → rule specs.
// Its methods mirror go-iptables.
type FakeTables struct {
	mu     sync.Mutex
	chains map[string]map[string][]string
	// Writes counts mutating calls, so tests can assert that a converged
	// namespace is left alone.
	Writes int
}

// NewFakeTables returns tables holding only the built-in chains.
func NewFakeTables() *FakeTables {
	t := &FakeTables{chains: make(map[string]map[string][]string)}
	for _, table := range []string{"filter", "mangle", "nat", "raw"} {
		t.chains[table] = make(map[string][]string)
		for _, c := range builtinChains(table) {
			t.chains[table][c] = nil
		}
	}
	return t
}

func (t *FakeTables) table(name string) (map[string][]string, error) {
	tb, ok := t.chains[name]
	if !ok {
		return nil, fmt.Errorf("fake iptables: no table %q", name)
	}
	return tb, nil
}

// ListChains returns built-in chains, then user chains sorted.
func (t *FakeTables) ListChains(table string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, err := t.table(table)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(builtinChains(table))
	var user []string
	for c := range tb {
		if !isBuiltin(table, c) {
			user = append(user, c)
		}
	}
	slices.Sort(user)
	return append(out, user...), nil
}

// List returns `iptables -S chain` lines.
func (t *FakeTables) List(table, chain string) ([]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, err := t.table(table)
	if err != nil {
		return nil, err
	}
	rules, ok := tb[chain]
	if !ok {
		return nil, fmt.Errorf("fake iptables: no chain %s/%s", table, chain)
	}
	head := "-N " + chain
	if isBuiltin(table, chain) {
		head = "-P " + chain + " ACCEPT"
	}
	out := []string{head}
	for _, r := range rules {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

func (t *FakeTables) ClearChain(table, chain string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, err := t.table(table)
	if err != nil {
		return err
	}
	t.Writes++
	tb[chain] = []string{}
	return nil
}

func (t *FakeTables) DeleteChain(table, chain string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, err := t.table(table)
	if err != nil {
		return err
	}
	rules, ok := tb[chain]
	switch {
	case !ok || isBuiltin(table, chain):
		return fmt.Errorf("fake iptables: cannot delete chain %s/%s", table, chain)
	case len(rules) > 0:
		return fmt.Errorf("fake iptables: chain %s/%s not empty", table, chain)
	}
	for from, rs := range tb {
		for _, r := range rs {
			if strings.HasSuffix(r, "-j "+chain) {
				return fmt.Errorf("fake iptables: chain %s/%s referenced from %s", table, chain, from)
			}
		}
	}
	t.Writes++
	delete(tb, chain)
	return nil
}

func (t *FakeTables) Insert(table, chain string, pos int, rulespec ...string) error {
	return t.write(table, chain, rulespec, func(rules []string, spec string) ([]string, error) {
		if pos < 1 || pos > len(rules)+1 {
			return nil, fmt.Errorf("fake iptables: index %d out of range", pos)
		}
		return slices.Insert(rules, pos-1, spec), nil
	})
}

func (t *FakeTables) Append(table, chain string, rulespec ...string) error {
	return t.write(table, chain, rulespec, func(rules []string, spec string) ([]string, error) {
		return append(rules, spec), nil
	})
}

func (t *FakeTables) Delete(table, chain string, rulespec ...string) error {
	return t.write(table, chain, rulespec, func(rules []string, spec string) ([]string, error) {
		i := slices.Index(rules, spec)
		if i < 0 {
			return nil, fmt.Errorf("fake iptables: rule %q not in %s/%s", spec, table, chain)
		}
		return slices.Delete(rules, i, i+1), nil
	})
}

func (t *FakeTables) write(table, chain string, rulespec []string, edit func([]string, string) ([]string, error)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	tb, err := t.table(table)
	if err != nil {
		return err
	}
	rules, ok := tb[chain]
	if !ok {
		return fmt.Errorf("fake iptables: no chain %s/%s", table, chain)
	}
	if n := len(rulespec); n >= 2 && rulespec[n-2] == "-j" && strings.HasPrefix(rulespec[n-1], "ISTIO_") {
		if _, ok := tb[rulespec[n-1]]; !ok {
			return fmt.Errorf("fake iptables: jump to missing chain %s", rulespec[n-1])
		}
	}
	rules, err = edit(slices.Clone(rules), strings.Join(rulespec, " "))
	if err != nil {
		return err
	}
	t.Writes++
	tb[chain] = rules
	return nil
}

// Restore implements iptables: it applies lines to a copy of table and
// swaps the copy in only if every line succeeds, as iptables-restore
// commits one transaction. It counts as one write.
func (t *FakeTables) Restore(table string, lines []string) error {
	t.mu.Lock()
	tb, err := t.table(table)
	if err != nil {
		t.mu.Unlock()
		return err
	}
	work := &FakeTables{chains: map[string]map[string][]string{table: {}}}
	for c, rs := range tb {
		work.chains[table][c] = slices.Clone(rs)
	}
	t.mu.Unlock()
	for _, line := range lines {
		if err := work.restoreLine(table, line); err != nil {
			return fmt.Errorf("fake iptables-restore: %q: %w", line, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.chains[table] = work.chains[table]
	t.Writes++
	return nil
}

func (t *FakeTables) restoreLine(table, line string) error {
	if chain, ok := strings.CutPrefix(line, ":"); ok {
		name, _, _ := strings.Cut(chain, " ")
		if _, exists := t.chains[table][name]; !exists {
			t.chains[table][name] = []string{}
		}
		return nil
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return fmt.Errorf("short line")
	}
	op, chain, args := f[0], f[1], f[2:]
	switch op {
	case "-F":
		if _, ok := t.chains[table][chain]; !ok {
			return fmt.Errorf("no chain %s", chain)
		}
		return t.ClearChain(table, chain)
	case "-X":
		return t.DeleteChain(table, chain)
	case "-A":
		return t.Append(table, chain, args...)
	case "-D":
		return t.Delete(table, chain, args...)
	case "-I":
		if len(args) == 0 || args[0] != "1" {
			return fmt.Errorf("insert supports position 1 only")
		}
		return t.Insert(table, chain, 1, args[1:]...)
	}
	return fmt.Errorf("unknown command %s", op)
}
