package rules

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The native nftables backend expresses a RuleSet as inet tables, named as
// Istio's nftables backend names them: one table per iptables table
// (istio-ambient-mangle, -nat, -raw), each with base chains named after the
// hooks (prerouting, output, postrouting) that jump into istio-prerouting /
// istio-output / istio-postrouting. The rules are not written a second time:
// NFTables translates the RuleSet's canonical iptables rules one by one, so
// both backends capture exactly the same traffic by construction, and the
// kernel tests run the same cases against both.
//
// An inet table sees IPv4 and IPv6 at once, while an iptables rule is of one
// family: every translated rule is therefore pinned to its family, by its
// address match (ip/ip6 saddr/daddr) or else by "meta nfproto". An IPv4-only
// RuleSet leaves IPv6 traffic alone, as iptables without ip6tables rules does.

// NFTTablePrefix starts the name of every nftables table this package owns.
const NFTTablePrefix = "istio-ambient-"

// NFTTableName is the inet table holding the rules of iptables table t.
func NFTTableName(t string) string { return NFTTablePrefix + t }

// NFTTable is one inet table of a translated RuleSet.
type NFTTable struct {
	Name   string
	Chains []NFTChain // in declaration order: base chains first
}

// NFTChain is one chain: Header is empty for a regular chain, else the base
// chain statement as nft lists it ("type nat hook output priority -100;
// policy accept;"). Rules are in nft's canonical listing form, without
// handles.
type NFTChain struct {
	Name   string
	Header string
	Rules  []string
}

// nftChainName maps an iptables chain to its nftables name.
func nftChainName(chain string) string {
	switch chain {
	case ChainPrerouting:
		return "istio-prerouting"
	case ChainOutput:
		return "istio-output"
	case ChainPostrouting:
		return "istio-postrouting"
	}
	return strings.ToLower(chain)
}

// nftHeader is the base chain statement for a built-in iptables chain, with
// the priorities iptables gives its tables (raw -300, mangle -150, dstnat
// -100, srcnat 100), so during a migration both backends' chains run at the
// same points. mangle OUTPUT is a route chain: a mark change re-routes the
// packet, as iptables' mangle OUTPUT does.
func nftHeader(table, chain string) (string, error) {
	hook := strings.ToLower(chain)
	var typ string
	var prio int
	switch table {
	case "raw":
		typ, prio = "filter", -300
	case "mangle":
		typ, prio = "filter", -150
		if hook == "output" {
			typ = "route"
		}
	case "nat":
		typ, prio = "nat", -100
		if hook == "postrouting" || hook == "input" {
			prio = 100
		}
	default:
		return "", fmt.Errorf("rules: nftables: no table for iptables table %q", table)
	}
	return fmt.Sprintf("type %s hook %s priority %d; policy accept;", typ, hook, prio), nil
}

// NFTables translates rs into inet tables: one per iptables table of
// rs.Owned that holds rules (a table left without rules is absent, and
// applying removes it). It fails on an iptables match or target it has no
// translation for, so nothing is half-translated.
func NFTables(rs RuleSet) ([]NFTTable, error) {
	if err := validateOwnership(rs); err != nil {
		return nil, err
	}
	var out []NFTTable
	for _, table := range nftOwnedTables(rs) {
		t := NFTTable{Name: NFTTableName(table)}
		idx := map[string]int{}
		chain := func(name string) *NFTChain {
			if i, ok := idx[name]; ok {
				return &t.Chains[i]
			}
			idx[name] = len(t.Chains)
			t.Chains = append(t.Chains, NFTChain{Name: name})
			return &t.Chains[len(t.Chains)-1]
		}
		// Base chains first (in iptables' hook order), then our chains in
		// the order rs.Owned lists them.
		for _, b := range builtinChains(table) {
			for _, r := range rs.Rules {
				if r.Table == table && r.Chain == b {
					h, err := nftHeader(table, b)
					if err != nil {
						return nil, err
					}
					chain(nftChainName(b)).Header = h
				}
			}
		}
		for _, f := range []Family{IPv4, IPv6} {
			for _, c := range rs.Owned {
				if c.Family == f && c.Table == table && rs.hasRules(c) {
					chain(nftChainName(c.Chain))
				}
			}
		}
		// Rules: IPv4's then IPv6's. Each rule is pinned to its family, so
		// only the order within a family matters, and it is kept.
		for _, f := range []Family{IPv4, IPv6} {
			for _, r := range rs.Rules {
				if r.Family != f || r.Table != table {
					continue
				}
				c := chain(nftChainName(r.Chain))
				if isBuiltin(table, r.Chain) {
					// A jump; both families share the base chain's one jump.
					jump := "jump " + nftChainName(r.Args[1])
					if !slices.Contains(c.Rules, jump) {
						c.Rules = append(c.Rules, jump)
					}
					if _, ok := idx[nftChainName(r.Args[1])]; !ok {
						chain(nftChainName(r.Args[1])) // declared, even if empty
					}
					continue
				}
				expr, err := nftRule(r)
				if err != nil {
					return nil, err
				}
				c.Rules = append(c.Rules, expr)
			}
		}
		if len(t.Chains) > 0 {
			out = append(out, t)
		}
	}
	return out, nil
}

// nftOwnedTables are the iptables tables of rs.Owned, in tableOrder.
func nftOwnedTables(rs RuleSet) []string {
	var out []string
	for _, t := range tableOrder() {
		for _, c := range rs.Owned {
			if c.Table == t {
				out = append(out, t)
				break
			}
		}
	}
	return out
}

// NFTOwnedTables names the inet tables rs owns: applying rs makes them hold
// exactly its translation; removing rs deletes them.
func NFTOwnedTables(rs RuleSet) []string {
	var out []string
	for _, t := range nftOwnedTables(rs) {
		out = append(out, NFTTableName(t))
	}
	return out
}

// nftRule translates one rule of an owned chain, in the canonical form `nft
// list` prints (checked by the kernel tests): hosts without a prefix
// length, marks as 8 hex digits, a protocol named only when no port match
// implies it, "counter" on every rule (as Istio's, for debugging).
func nftRule(r Rule) (string, error) {
	ip := "ip"
	if r.Family == IPv6 {
		ip = "ip6"
	}
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("rules: nftables: rule %q: %s", r, why)
	}
	var (
		exprs    []string
		proto    string
		protoAt  = -1
		hasPort  bool
		hasAddr  bool
		module   string
		neg      bool
		verdict  string
		args     = r.Args
		op       = func() string { return map[bool]string{false: "", true: "!= "}[neg] }
		cmpOp    = func() string { return map[bool]string{false: "==", true: "!="}[neg] }
		nextArg  = func(i int) (string, bool) { return argAt(args, i+1) }
		consumed int
	)
	for i := 0; i < len(args); i += consumed {
		consumed = 1
		a := args[i]
		if a == "!" {
			neg = true
			continue
		}
		v, hasV := nextArg(i)
		switch a {
		case "-s", "-d":
			if !hasV {
				return bad("missing address")
			}
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return bad(err.Error())
			}
			if p.Addr().Is4() != (r.Family == IPv4) {
				return bad("address of the other family")
			}
			dir := "saddr"
			if a == "-d" {
				dir = "daddr"
			}
			exprs = append(exprs, fmt.Sprintf("%s %s %s%s", ip, dir, op(), nftPrefix(p)))
			hasAddr, consumed = true, 2
		case "-i", "-o":
			if !hasV {
				return bad("missing interface")
			}
			kw := "iifname"
			if a == "-o" {
				kw = "oifname"
			}
			exprs = append(exprs, fmt.Sprintf("%s %s%q", kw, op(), v))
			consumed = 2
		case "-p":
			if !hasV || (v != "tcp" && v != "udp") || neg {
				return bad("unsupported protocol")
			}
			proto, protoAt, consumed = v, len(exprs), 2
			exprs = append(exprs, "") // placeholder, see below
		case "-m":
			if !hasV {
				return bad("missing match")
			}
			switch v {
			case "tcp", "udp", "mark", "connmark":
			default:
				return bad("no nftables translation for match " + v)
			}
			module, consumed = v, 2
		case "--dport", "--sport":
			if !hasV || proto == "" {
				return bad("port without protocol")
			}
			if _, err := strconv.ParseUint(v, 10, 16); err != nil {
				return bad("bad port " + v)
			}
			exprs = append(exprs, fmt.Sprintf("%s %s %s%s", proto, strings.TrimPrefix(a, "--"), op(), v))
			hasPort, consumed = true, 2
		case "--mark":
			val, mask, err := markMask(v)
			if err != nil || (module != "mark" && module != "connmark") {
				return bad("bad mark match")
			}
			kw := "meta mark"
			if module == "connmark" {
				kw = "ct mark"
			}
			exprs = append(exprs, fmt.Sprintf("%s & 0x%08x %s 0x%08x", kw, mask, cmpOp(), val))
			consumed = 2
		case "-j":
			s, err := nftVerdict(args[i+1:])
			if err != nil {
				return bad(err.Error())
			}
			verdict, consumed = s, len(args)-i
		default:
			return bad("no nftables translation for " + a)
		}
		neg = false
	}
	if verdict == "" {
		return bad("no target")
	}
	if protoAt >= 0 {
		if hasPort {
			exprs = slices.Delete(exprs, protoAt, protoAt+1)
		} else {
			exprs[protoAt] = "meta l4proto " + proto
		}
	}
	if !hasAddr {
		exprs = slices.Insert(exprs, 0, "meta nfproto "+map[Family]string{IPv4: "ipv4", IPv6: "ipv6"}[r.Family])
	}
	exprs = append(exprs, "counter", verdict)
	return strings.Join(exprs, " "), nil
}

func argAt(args []string, i int) (string, bool) {
	if i < len(args) {
		return args[i], true
	}
	return "", false
}

// nftVerdict translates "-j TARGET [options]".
func nftVerdict(t []string) (string, error) {
	if len(t) == 0 {
		return "", fmt.Errorf("missing target")
	}
	opts := strings.Join(t[1:], " ")
	switch t[0] {
	case "RETURN", "ACCEPT":
		if opts == "" {
			return strings.ToLower(t[0]), nil
		}
	case "REDIRECT":
		if len(t) == 3 && t[1] == "--to-ports" {
			if _, err := strconv.ParseUint(t[2], 10, 16); err == nil {
				return "redirect to :" + t[2], nil
			}
		}
	case "CT":
		if len(t) == 3 && t[1] == "--zone" {
			if _, err := strconv.ParseUint(t[2], 10, 16); err == nil {
				return "ct zone set " + t[2], nil
			}
		}
	case "CONNMARK":
		if opts == "--restore-mark --nfmask 0xffffffff --ctmask 0xffffffff" {
			return "meta mark set ct mark", nil
		}
		if len(t) == 3 && t[1] == "--set-xmark" {
			val, mask, err := markMask(t[2])
			// ctmark = (ctmark & ^mask) ^ val; with val inside mask the
			// XOR is an OR, which nft stores (and lists) as
			// "& (^mask|val) | val".
			if err == nil && val&^mask == 0 {
				return fmt.Sprintf("ct mark set ct mark & 0x%08x | 0x%08x", ^mask|val, val), nil
			}
		}
	}
	return "", fmt.Errorf("no nftables translation for target %q", strings.Join(t, " "))
}

// markMask parses "value/mask" as iptables prints it.
func markMask(s string) (val, mask uint32, err error) {
	v, m, ok := strings.Cut(s, "/")
	if !ok {
		m = "0xffffffff"
	}
	pv, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return 0, 0, err
	}
	pm, err := strconv.ParseUint(m, 0, 32)
	if err != nil {
		return 0, 0, err
	}
	return uint32(pv), uint32(pm), nil
}

// nftPrefix prints a host without its prefix length, as nft lists it.
func nftPrefix(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.Masked().String()
}

// RenderNFT prints tables as one nft script body in the form `nft list
// table` prints them (tabs, a blank line between chains). It is both the
// golden-file format and, after the transaction preamble, what `nft -f`
// reads.
func RenderNFT(tables []NFTTable) string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "table inet %s {\n", t.Name)
		for i, c := range t.Chains {
			if i > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
			if c.Header != "" {
				fmt.Fprintf(&b, "\t\t%s\n", c.Header)
			}
			for _, r := range c.Rules {
				fmt.Fprintf(&b, "\t\t%s\n", r)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

var (
	nftCounter = regexp.MustCompile(`\bcounter packets \d+ bytes \d+`)
	nftHandle  = regexp.MustCompile(`\s+# handle \d+$`)
	nftPrio    = regexp.MustCompile(`\bpriority ([a-z]+)([+-]\d+)?;`)
)

// nftPriorities are the names nft lists standard priorities by.
var nftPriorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

// parseNFTTable reads one `nft list table inet NAME` listing back into an
// NFTTable: counters are dropped and priority names turned into numbers, so
// it compares equal to the translation when the kernel holds exactly it.
func parseNFTTable(listing string) (NFTTable, error) {
	var t NFTTable
	var cur *NFTChain
	for _, raw := range strings.Split(listing, "\n") {
		line := strings.TrimSpace(nftHandle.ReplaceAllString(raw, ""))
		switch {
		case line == "":
		case strings.HasPrefix(line, "table inet ") && strings.HasSuffix(line, "{"):
			t.Name = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(line, "table inet "), "{"))
		case strings.HasPrefix(line, "chain ") && strings.HasSuffix(line, "{"):
			t.Chains = append(t.Chains, NFTChain{Name: strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(line, "chain "), "{"))})
			cur = &t.Chains[len(t.Chains)-1]
		case line == "}":
			cur = nil
		case cur == nil:
			return NFTTable{}, fmt.Errorf("rules: nftables: unexpected line %q outside a chain", line)
		case strings.HasPrefix(line, "type "):
			cur.Header = nftPrio.ReplaceAllStringFunc(line, func(m string) string {
				sm := nftPrio.FindStringSubmatch(m)
				n, ok := nftPriorities[sm[1]]
				if !ok {
					return m
				}
				if sm[2] != "" {
					d, _ := strconv.Atoi(sm[2])
					n += d
				}
				return fmt.Sprintf("priority %d;", n)
			})
		default:
			cur.Rules = append(cur.Rules, nftCounter.ReplaceAllString(line, "counter"))
		}
	}
	if t.Name == "" {
		return NFTTable{}, fmt.Errorf("rules: nftables: no table in listing %q", listing)
	}
	return t, nil
}

// diffNFT compares the tables the kernel holds (have, by name; absent
// tables are missing from it) with the translation want, over the owned
// table names, in the Diff vocabulary: nft rules and chain headers are
// Rules whose Table is "inet NAME"; Misordered and Stale name a chain (Stale
// with Chain "" is a whole table). rewrite lists the tables that differ.
func diffNFT(owned []string, have map[string]NFTTable, want []NFTTable) (d Diff, rewrite []string) {
	wantBy := map[string]NFTTable{}
	for _, t := range want {
		wantBy[t.Name] = t
	}
	for _, name := range owned {
		h, exists := have[name]
		w, wanted := wantBy[name]
		ref := "inet " + name
		if !wanted {
			if exists {
				d.Stale = append(d.Stale, ChainRef{Table: ref})
				rewrite = append(rewrite, name)
			}
			continue
		}
		before := d
		hc := map[string]NFTChain{}
		for _, c := range h.Chains {
			hc[c.Name] = c
		}
		for _, wc := range w.Chains {
			got, ok := hc[wc.Name]
			delete(hc, wc.Name)
			if wc.Header != got.Header {
				if wc.Header != "" {
					d.Missing = append(d.Missing, Rule{Table: ref, Chain: wc.Name, Args: strings.Fields(wc.Header)})
				}
				if got.Header != "" {
					d.Extra = append(d.Extra, Rule{Table: ref, Chain: wc.Name, Args: strings.Fields(got.Header)})
				}
			}
			missing, extra := multisetDiff(wc.Rules, got.Rules)
			for _, s := range missing {
				d.Missing = append(d.Missing, Rule{Table: ref, Chain: wc.Name, Args: strings.Fields(s)})
			}
			for _, s := range extra {
				d.Extra = append(d.Extra, Rule{Table: ref, Chain: wc.Name, Args: strings.Fields(s)})
			}
			if ok && len(missing)+len(extra) == 0 && !slices.Equal(wc.Rules, got.Rules) {
				d.Misordered = append(d.Misordered, ChainRef{Table: ref, Chain: wc.Name})
			}
		}
		for _, c := range h.Chains {
			if _, left := hc[c.Name]; left {
				d.Stale = append(d.Stale, ChainRef{Table: ref, Chain: c.Name})
			}
		}
		if !exists || !diffEqual(before, d) {
			rewrite = append(rewrite, name)
		}
	}
	return d, rewrite
}

func diffEqual(a, b Diff) bool {
	return len(a.Missing) == len(b.Missing) && len(a.Extra) == len(b.Extra) &&
		len(a.Misordered) == len(b.Misordered) && len(a.Stale) == len(b.Stale)
}

// nftScript is the one transaction that makes the rewritten tables hold
// their translation and deletes the owned tables that should not exist.
// Each rewritten table is created if missing ("add table" is a no-op
// otherwise), flushed, stripped of chains the translation does not declare
// or declares with another header, and refilled; nft applies the whole
// script as one batch, so packets see the old rules or the new ones, never
// a flushed table. A table to delete is added first, so deleting it cannot
// fail on its absence.
func nftScript(rewrite []string, have map[string]NFTTable, want []NFTTable) string {
	wantBy := map[string]NFTTable{}
	for _, t := range want {
		wantBy[t.Name] = t
	}
	var b strings.Builder
	var fill []NFTTable
	for _, name := range rewrite {
		fmt.Fprintf(&b, "add table inet %s\n", name)
		w, wanted := wantBy[name]
		if !wanted {
			fmt.Fprintf(&b, "delete table inet %s\n", name)
			continue
		}
		if _, exists := have[name]; !exists {
			fill = append(fill, w)
			continue
		}
		fmt.Fprintf(&b, "flush table inet %s\n", name)
		keep := map[string]string{}
		for _, c := range w.Chains {
			keep[c.Name] = c.Header
		}
		for _, c := range have[name].Chains {
			if h, ok := keep[c.Name]; !ok || h != c.Header {
				fmt.Fprintf(&b, "delete chain inet %s %s\n", name, c.Name)
			}
		}
		fill = append(fill, w)
	}
	b.WriteString(RenderNFT(fill))
	return b.String()
}
