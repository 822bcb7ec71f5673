package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// goDurations rewrites, in the JSON of a message of descriptor md, every
// google.protobuf.Duration written as a Go duration ("3m", "1h30m",
// "500ms") into protobuf JSON's seconds form ("180s"), as Kubernetes mode
// reads them: Istio's own JSON decoder (client-go) accepts both, and Istio's
// documentation and samples use the Go form (outlierDetection's
// baseEjectionTime: 3m). Anything else is left for protojson to judge.
func goDurations(js []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	var v any
	if err := json.Unmarshal(js, &v); err != nil {
		return js, nil // protojson reports it
	}
	if !rewriteDurations(v, md) {
		return js, nil
	}
	return json.Marshal(v)
}

// rewriteDurations walks v (decoded JSON of a message md) and reports
// whether it changed anything.
func rewriteDurations(v any, md protoreflect.MessageDescriptor) bool {
	obj, ok := v.(map[string]any)
	if !ok {
		return false
	}
	changed := false
	for key, val := range obj {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(key))
		}
		if fd == nil {
			continue
		}
		if fd.IsMap() {
			fd = fd.MapValue()
			if m, ok := val.(map[string]any); ok && fd.Message() != nil {
				for k, e := range m {
					if s, ok := durationJSON(e, fd.Message()); ok {
						m[k], changed = s, true
					} else {
						changed = rewriteDurations(e, fd.Message()) || changed
					}
				}
			}
			continue
		}
		if fd.Message() == nil {
			continue
		}
		if list, ok := val.([]any); ok && fd.IsList() {
			for i, e := range list {
				if s, ok := durationJSON(e, fd.Message()); ok {
					list[i], changed = s, true
				} else {
					changed = rewriteDurations(e, fd.Message()) || changed
				}
			}
			continue
		}
		if s, ok := durationJSON(val, fd.Message()); ok {
			obj[key], changed = s, true
			continue
		}
		changed = rewriteDurations(val, fd.Message()) || changed
	}
	return changed
}

// durationJSON converts a Go duration string for a Duration message
// (seconds written "2s" or "0.5s" parse the same and come out unchanged).
func durationJSON(v any, md protoreflect.MessageDescriptor) (string, bool) {
	s, ok := v.(string)
	if !ok || md.FullName() != "google.protobuf.Duration" {
		return "", false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return "", false // protojson reports it
	}
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	sec, nanos := int64(d/time.Second), int64(d%time.Second)
	if nanos == 0 {
		return fmt.Sprintf("%s%ds", sign, sec), true
	}
	return sign + strings.TrimRight(fmt.Sprintf("%d.%09d", sec, nanos), "0") + "s", true
}
