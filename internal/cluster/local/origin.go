package local

import "github.com/ztunnel-go/ztunnel-go/internal/cluster"

// Origin says which file and document (0-based, as in cluster.DocError) the
// object key ("<Kind>/<namespace>/<name>", a cluster.Item key) was read
// from, so that problems found later (an AuthorizationPolicy value that
// cannot be enforced, say) are reported the way decode errors are.
func (s *Source) Origin(key string) (file string, doc int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, f := range s.files {
		if i, found := f.origins[key]; found {
			return p, i, true
		}
	}
	return "", 0, false
}

// originsOf maps each object of a file to its document index, decoding the
// documents one by one (a second decode, only when the file changed).
func originsOf(file string, data []byte) map[string]int {
	out := map[string]int{}
	for i, doc := range cluster.SplitDocuments(data) {
		if doc == nil {
			continue
		}
		var o cluster.Objects
		_ = cluster.Decode(file, doc, &o) // errors are reported by Load's own decode
		for _, it := range o.Items() {
			out[it.Key] = i
		}
	}
	return out
}
