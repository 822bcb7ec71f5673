// Package apicoverage decides, for every field of every API kind the
// control plane reads, whether ztunnel-go enforces it as its API defines
// it, refuses it where users look, or why it does not apply. The field
// set comes from the API modules themselves (istio.io/api descriptors,
// the Kubernetes and Gateway API Go types, istio.io/api's label and
// annotation lists), so an API upgrade that adds a field fails
// TestFieldCoverage until someone decides it. docs/api-coverage.md is
// generated from the same table.
package apicoverage

import (
	"fmt"
	"sort"
	"strings"
)

// Decision is the entry that decides one field.
type Decision struct {
	Field string
	Entry Entry
}

// covers is true when the entry's path is the field or one of its
// ancestors.
func covers(entry, field string) bool {
	if entry == field {
		return true
	}
	if !strings.HasPrefix(field, entry) {
		return false
	}
	rest := field[len(entry):]
	return strings.HasPrefix(rest, ".")
}

// Decide returns the entry that decides field of kind: the most specific
// entry whose path is the field or an ancestor of it.
func Decide(kind, field string) (Entry, bool) {
	var best Entry
	found := false
	for _, e := range table[kind] {
		if covers(e.Path, field) && (!found || len(e.Path) > len(best.Path)) {
			best, found = e, true
		}
	}
	return best, found
}

// Entries returns kind's entries in the order of its fields.
func Entries(kind string) []Entry {
	out := append([]Entry(nil), table[kind]...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Problems lists what is wrong with kind's part of the table: a field no
// entry decides, an entry given twice, an entry that names no field of
// the API (a typo, or a field an upgrade removed), an entry without its
// test or its note.
func Problems(k Kind) []string {
	var out []string
	fields := k.Fields()
	seen := map[string]bool{}
	for _, e := range table[k.Name] {
		if seen[e.Path] {
			out = append(out, fmt.Sprintf("%s %s: listed twice", k.Name, e.Path))
		}
		seen[e.Path] = true
		used := false
		for _, f := range fields {
			if covers(e.Path, f) {
				used = true
				break
			}
		}
		if !used {
			out = append(out, fmt.Sprintf("%s %s: no such field in the API", k.Name, e.Path))
		}
		switch e.State {
		case Enforced:
			if e.Test == "" {
				out = append(out, fmt.Sprintf("%s %s: enforced without the test that proves it", k.Name, e.Path))
			}
		case Refused:
			if e.Test == "" || e.Note == "" {
				out = append(out, fmt.Sprintf("%s %s: refused needs the test that proves the refusal and what happens", k.Name, e.Path))
			}
		case NotApplicable:
			if e.Note == "" {
				out = append(out, fmt.Sprintf("%s %s: not applicable needs why", k.Name, e.Path))
			}
		default:
			out = append(out, fmt.Sprintf("%s %s: no state", k.Name, e.Path))
		}
	}
	for _, f := range fields {
		if _, ok := Decide(k.Name, f); !ok {
			out = append(out, fmt.Sprintf("%s %s: undecided (enforce it with a test, refuse it with a message, or say why it does not apply)", k.Name, f))
		}
	}
	return out
}
