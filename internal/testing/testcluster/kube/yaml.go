package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// Map is an ordered YAML mapping: keys are written in slice order, so objects
// read the way kubectl prints them (apiVersion, kind, metadata, spec, status).
type Map []KV

// KV is one Map entry.
type KV struct {
	Key   string
	Value any
}

// encodeYAML writes v as a block-style YAML document. Supported values: Map,
// map[string]string and map[string]any (keys sorted), []any, []string, []Map,
// string, bool, the int types, netip.Addr and netip.Prefix; nil, empty maps
// and empty slices are skipped by the Map encoder (Kubernetes' omitempty).
//
// A KeepEmpty value inside v switches that subtree to "write everything":
// empty mappings become {}, empty sequences [], nil null, "" "" (for Raw
// objects, where `source: {}` means something).
func encodeYAML(buf *bytes.Buffer, v any) error {
	return writeValue(buf, v, 0, false, false)
}

// KeepEmpty wraps a value whose empty members must be written, not omitted.
type KeepEmpty struct{ V any }

// emptyLiteral is how an empty value is written in a KeepEmpty subtree.
func emptyLiteral(v any) string {
	switch normalize(v).(type) {
	case nil:
		return "null"
	case Map:
		return "{}"
	case []any:
		return "[]"
	}
	return `""`
}

// isEmpty reports values a Map entry omits.
func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case Map:
		return len(x) == 0
	case map[string]string:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	case []string:
		return len(x) == 0
	case []Map:
		return len(x) == 0
	case netip.Addr:
		return !x.IsValid()
	case netip.Prefix:
		return !x.IsValid()
	}
	return false
}

// normalize turns the convenience types into Map / []any / scalars.
func normalize(v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case map[string]string:
		m := make(Map, 0, len(x))
		for _, k := range sortedKeys(x) {
			m = append(m, KV{k, x[k]})
		}
		return m
	case map[string]any:
		m := make(Map, 0, len(x))
		for _, k := range sortedKeys(x) {
			m = append(m, KV{k, x[k]})
		}
		return m
	case []string:
		s := make([]any, len(x))
		for i := range x {
			s[i] = x[i]
		}
		return s
	case []Map:
		s := make([]any, len(x))
		for i := range x {
			s[i] = x[i]
		}
		return s
	case netip.Addr:
		return x.String()
	case netip.Prefix:
		return x.String()
	}
	return v
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// writeValue writes v at indent. inSeq means the caller already wrote "- "
// and the first line of a mapping continues on that line.
func writeValue(buf *bytes.Buffer, v any, indent int, inSeq, keep bool) error {
	if k, ok := v.(KeepEmpty); ok {
		v, keep = k.V, true
	}
	v = normalize(v)
	pad := strings.Repeat("  ", indent)
	switch x := v.(type) {
	case Map:
		first := true
		for _, kv := range x {
			val, keepHere := kv.Value, keep
			if k, ok := val.(KeepEmpty); ok {
				val, keepHere = k.V, true
			}
			if isEmpty(val) && !keepHere {
				continue
			}
			if !(first && inSeq) {
				buf.WriteString(pad)
			}
			first = false
			buf.WriteString(scalarString(kv.Key))
			buf.WriteByte(':')
			if isEmpty(val) {
				buf.WriteString(" " + emptyLiteral(val) + "\n")
				continue
			}
			val = normalize(val)
			switch val.(type) {
			case Map:
				buf.WriteByte('\n')
				if err := writeValue(buf, val, indent+1, false, keepHere); err != nil {
					return fmt.Errorf("%s: %w", kv.Key, err)
				}
			case []any:
				// Sequences under a key are written at the key's indent, as
				// kubectl does.
				buf.WriteByte('\n')
				if err := writeValue(buf, val, indent, false, keepHere); err != nil {
					return fmt.Errorf("%s: %w", kv.Key, err)
				}
			default:
				buf.WriteByte(' ')
				s, err := scalar(val)
				if err != nil {
					return fmt.Errorf("%s: %w", kv.Key, err)
				}
				buf.WriteString(s)
				buf.WriteByte('\n')
			}
		}
		if first { // every entry was empty
			if inSeq {
				buf.WriteString("{}\n")
			}
		}
		return nil
	case []any:
		for _, item := range x {
			buf.WriteString(pad)
			buf.WriteString("- ")
			if k, ok := item.(KeepEmpty); ok {
				item = k.V
			}
			item = normalize(item)
			switch m := item.(type) {
			case Map:
				if len(m) == 0 {
					buf.WriteString("{}\n")
					continue
				}
				if err := writeValue(buf, item, indent+1, true, keep); err != nil {
					return err
				}
			case []any:
				return fmt.Errorf("kube: nested sequences are not supported")
			case nil:
				buf.WriteString("null\n")
				continue
			default:
				s, err := scalar(item)
				if err != nil {
					return err
				}
				buf.WriteString(s)
				buf.WriteByte('\n')
			}
		}
		return nil
	default:
		s, err := scalar(v)
		if err != nil {
			return err
		}
		buf.WriteString(pad)
		buf.WriteString(s)
		buf.WriteByte('\n')
		return nil
	}
}

func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return scalarString(x), nil
	case bool:
		return strconv.FormatBool(x), nil
	case int:
		return strconv.Itoa(x), nil
	case int32:
		return strconv.FormatInt(int64(x), 10), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case uint16:
		return strconv.FormatUint(uint64(x), 10), nil
	case uint32:
		return strconv.FormatUint(uint64(x), 10), nil
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64), nil
	}
	return "", fmt.Errorf("kube: cannot encode %T as YAML", v)
}

// scalarString writes s plain when that is unambiguous and as a JSON string
// (a valid YAML double-quoted scalar) otherwise, so "true", "8080", "" or
// "a: b" stay strings.
func scalarString(s string) string {
	if plainSafe(s) {
		return s
	}
	b, _ := json.Marshal(s) // a string never fails to marshal
	return string(b)
}

func plainSafe(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~":
		return false
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return false
	}
	if _, err := strconv.ParseInt(s, 0, 64); err == nil {
		return false
	}
	// A leading digit or dot may read as a number, timestamp or .inf in YAML
	// 1.1; addresses and prefixes are the exception worth keeping plain.
	if c := s[0]; c == '.' || c >= '0' && c <= '9' {
		if _, err := netip.ParseAddr(s); err != nil {
			if _, err := netip.ParsePrefix(s); err != nil {
				return false
			}
		}
	}
	// Characters that can start an indicator or must not begin a plain scalar.
	if strings.ContainsAny(s[:1], "-?:,[]{}#&*!|>'\"%@` ") {
		return false
	}
	for _, r := range s {
		// Only a conservative set is written plain; anything else is quoted.
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("-_./", r)) {
			return false
		}
	}
	return true
}
