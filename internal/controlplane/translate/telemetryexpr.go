package translate

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ztunnel-go/ztunnel-go/internal/api/waypointapi"
)

// istioMetricLabels are the labels of Istio's standard metrics a tag
// override may change or remove.
var istioMetricLabels = []string{
	"reporter",
	"source_workload", "source_canonical_service", "source_canonical_revision", "source_workload_namespace",
	"source_principal", "source_app", "source_version", "source_cluster",
	"destination_workload", "destination_workload_namespace", "destination_principal",
	"destination_app", "destination_version", "destination_service",
	"destination_canonical_service", "destination_canonical_revision",
	"destination_service_name", "destination_service_namespace", "destination_cluster",
	"request_protocol", "response_flags", "connection_security_policy",
	"response_code", "grpc_response_status",
}

// attributes are the CEL attribute names we evaluate.
var attributes = map[string]waypointapi.Attribute{
	"request.host":      waypointapi.Attribute_REQUEST_HOST,
	"request.method":    waypointapi.Attribute_REQUEST_METHOD,
	"request.path":      waypointapi.Attribute_REQUEST_PATH,
	"request.url_path":  waypointapi.Attribute_REQUEST_URL_PATH,
	"request.scheme":    waypointapi.Attribute_REQUEST_SCHEME,
	"request.protocol":  waypointapi.Attribute_REQUEST_PROTOCOL,
	"response.code":     waypointapi.Attribute_RESPONSE_CODE,
	"response.duration": waypointapi.Attribute_RESPONSE_DURATION_MS,
}

// ParseTagValue parses a tagOverrides value: an attribute
// (request.host, request.method, request.path, request.url_path,
// request.scheme, request.protocol, response.code), a request header
// (request.headers['name']) or a quoted string literal. Anything else is
// refused: the waypoint evaluates no CEL.
func ParseTagValue(expr string) (*waypointapi.TagValue, error) {
	e := strings.TrimSpace(expr)
	v := &waypointapi.TagValue{Expression: expr}
	if s, ok := unquote(e); ok {
		v.Literal = s
		return v, nil
	}
	a, h, err := parseAttribute(e)
	if err != nil {
		return nil, err
	}
	if a == waypointapi.Attribute_RESPONSE_DURATION_MS {
		return nil, fmt.Errorf("%q: response.duration as a label value is unbounded", expr)
	}
	v.Attribute, v.Header = a, h
	return v, nil
}

func parseAttribute(e string) (waypointapi.Attribute, string, error) {
	if a, ok := attributes[e]; ok {
		return a, "", nil
	}
	if rest, ok := strings.CutPrefix(e, "request.headers["); ok && strings.HasSuffix(rest, "]") {
		if name, ok := unquote(strings.TrimSpace(rest[:len(rest)-1])); ok && name != "" {
			return waypointapi.Attribute_REQUEST_HEADER, strings.ToLower(name), nil
		}
	}
	return 0, "", fmt.Errorf("%q is not supported: an attribute (request.host, request.method, request.path, request.url_path, request.scheme, request.protocol, response.code), request.headers['name'] or a quoted string", e)
}

func unquote(s string) (string, bool) {
	if len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
		inner := s[1 : len(s)-1]
		if !strings.ContainsAny(inner, "'\"\\") {
			return inner, true
		}
	}
	return "", false
}

var logOps = []struct {
	tok string
	op  waypointapi.LogCondition_Op
}{
	{">=", waypointapi.LogCondition_GE}, {"<=", waypointapi.LogCondition_LE}, {"==", waypointapi.LogCondition_EQ},
	{"!=", waypointapi.LogCondition_NE}, {">", waypointapi.LogCondition_GT}, {"<", waypointapi.LogCondition_LT},
}

// ParseLogFilter parses an accessLogging filter expression: comparisons
// "<attribute> <op> <value>" joined by &&, op one of == != < <= > >=, the
// value a number (for response.code and response.duration, in ms) or a
// quoted string (==, != only). Anything else (||, !, functions, has())
// is refused.
func ParseLogFilter(expr string) ([]*waypointapi.LogCondition, error) {
	var out []*waypointapi.LogCondition
	for part := range strings.SplitSeq(expr, "&&") {
		part = strings.TrimSpace(part)
		var c *waypointapi.LogCondition
		for _, o := range logOps {
			l, r, ok := strings.Cut(part, o.tok)
			if !ok {
				continue
			}
			a, h, err := parseAttribute(strings.TrimSpace(l))
			if err != nil {
				return nil, err
			}
			c = &waypointapi.LogCondition{Attribute: a, Header: h, Op: o.op}
			r = strings.TrimSpace(r)
			numeric := a == waypointapi.Attribute_RESPONSE_CODE || a == waypointapi.Attribute_RESPONSE_DURATION_MS
			if numeric {
				if _, err := strconv.ParseInt(r, 10, 64); err != nil {
					return nil, fmt.Errorf("%q: %s compares with an integer", part, l)
				}
				c.Value = r
			} else {
				s, ok := unquote(r)
				if !ok {
					return nil, fmt.Errorf("%q: %s compares with a quoted string", part, strings.TrimSpace(l))
				}
				if o.op != waypointapi.LogCondition_EQ && o.op != waypointapi.LogCondition_NE {
					return nil, fmt.Errorf("%q: strings compare with == or != only", part)
				}
				c.Value = s
			}
			break
		}
		if c == nil {
			return nil, fmt.Errorf("%q is not supported: comparisons (== != < <= > >=) of an attribute joined by &&", part)
		}
		out = append(out, c)
	}
	return out, nil
}
