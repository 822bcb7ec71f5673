package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// ErrUnsupportedKind marks a document of a kind the control plane does not
// read (a Deployment, say). Callers usually warn and skip it.
var ErrUnsupportedKind = errors.New("unsupported kind")

// DocError says which document of which file is bad, and why.
type DocError struct {
	File  string
	Index int // 0-based document index in the file
	Kind  string
	Name  string // namespace/name when known
	Err   error
}

func (e *DocError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: document %d", e.File, e.Index)
	if e.Kind != "" {
		fmt.Fprintf(&b, " (%s", e.Kind)
		if e.Name != "" {
			fmt.Fprintf(&b, " %s", e.Name)
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

func (e *DocError) Unwrap() error { return e.Err }

// SplitDocuments splits a multi-document YAML stream on "---" lines.
func SplitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if len(bytes.TrimSpace(stripComments(cur.Bytes()))) > 0 {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
		} else {
			docs = append(docs, nil)
		}
		cur.Reset()
	}
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		t := bytes.TrimRight(line, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			flush()
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			continue
		}
		out = append(out, line...)
		out = append(out, '\n')
	}
	return out
}

// Decode parses every document of one file and adds the objects to o. It
// returns one *DocError per bad document; good documents are added even when
// others fail. Documents that are empty (comments only) are skipped. A
// document of kind List has its items decoded one by one.
func Decode(file string, data []byte, o *Objects) []error {
	var errs []error
	for i, doc := range SplitDocuments(data) {
		if doc == nil {
			continue
		}
		errs = append(errs, decodeDoc(file, i, doc, o)...)
	}
	return errs
}

func decodeDoc(file string, idx int, doc []byte, o *Objects) []error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return []error{&DocError{File: file, Index: idx, Err: fmt.Errorf("invalid YAML: %w", err)}}
	}
	var tm struct {
		metav1.TypeMeta
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(js, &tm); err != nil {
		return []error{&DocError{File: file, Index: idx, Err: fmt.Errorf("not an object: %w", err)}}
	}
	derr := func(err error) *DocError {
		name := tm.Metadata.Name
		if tm.Metadata.Namespace != "" {
			name = tm.Metadata.Namespace + "/" + name
		}
		return &DocError{File: file, Index: idx, Kind: tm.Kind, Name: name, Err: err}
	}
	if tm.Kind == "List" || strings.HasSuffix(tm.Kind, "List") && tm.Items != nil {
		var errs []error
		for _, it := range tm.Items {
			for _, e := range decodeDoc(file, idx, it, o) {
				errs = append(errs, e)
			}
		}
		return errs
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return []error{derr(errors.New("missing apiVersion or kind"))}
	}
	if tm.Metadata.Name == "" {
		return []error{derr(errors.New("missing metadata.name"))}
	}
	group := tm.APIVersion
	if i := strings.Index(group, "/"); i >= 0 {
		group = group[:i]
	} else {
		group = ""
	}
	key := group + "/" + tm.Kind
	var err2 error
	switch key {
	case "/Namespace":
		var v corev1.Namespace
		if err2 = strict(js, &v); err2 == nil {
			o.Namespaces = append(o.Namespaces, &v)
		}
	case "/Pod":
		var v corev1.Pod
		if err2 = strict(js, &v); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.Pods = append(o.Pods, &v)
		}
	case "/Service":
		var v corev1.Service
		if err2 = strict(js, &v); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.Services = append(o.Services, &v)
		}
	case "discovery.k8s.io/EndpointSlice":
		var v discoveryv1.EndpointSlice
		if err2 = strict(js, &v); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.EndpointSlices = append(o.EndpointSlices, &v)
		}
	case "networking.istio.io/ServiceEntry":
		var v networkingv1.ServiceEntry
		if err2 = strictIstio(js, &v, &v.Spec, &v.Status); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.ServiceEntries = append(o.ServiceEntries, &v)
		}
	case "networking.istio.io/WorkloadEntry":
		var v networkingv1.WorkloadEntry
		if err2 = strictIstio(js, &v, &v.Spec, &v.Status); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.WorkloadEntries = append(o.WorkloadEntries, &v)
		}
	case "security.istio.io/AuthorizationPolicy":
		var v securityv1.AuthorizationPolicy
		if err2 = strictIstio(js, &v, &v.Spec, &v.Status); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.AuthorizationPolicies = append(o.AuthorizationPolicies, &v)
		}
	case "security.istio.io/PeerAuthentication":
		var v securityv1.PeerAuthentication
		if err2 = strictIstio(js, &v, &v.Spec, &v.Status); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.PeerAuthentications = append(o.PeerAuthentications, &v)
		}
	case "gateway.networking.k8s.io/Gateway":
		var v gatewayv1.Gateway
		if err2 = strict(js, &v); err2 == nil {
			defaultNamespace(&v.ObjectMeta)
			o.Gateways = append(o.Gateways, &v)
		}
	case "gateway.networking.k8s.io/GatewayClass":
		var v gatewayv1.GatewayClass
		if err2 = strict(js, &v); err2 == nil {
			o.GatewayClasses = append(o.GatewayClasses, &v)
		}
	default:
		err2 = fmt.Errorf("%w %s %s", ErrUnsupportedKind, tm.APIVersion, tm.Kind)
	}
	if err2 != nil {
		return []error{derr(err2)}
	}
	return nil
}

func defaultNamespace(m *metav1.ObjectMeta) {
	if m.Namespace == "" {
		m.Namespace = "default"
	}
}

// strict decodes js into v, rejecting unknown fields with their path.
func strict(js []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("field error: %w", err)
	}
	return nil
}

// strictIstio decodes an Istio object: metadata strictly through encoding/json,
// the spec strictly through protojson (the Istio types' own JSON decoder
// silently drops unknown spec fields), and the status leniently (it is written
// by controllers, not by the user).
func strictIstio(js []byte, obj any, spec, status proto.Message) error {
	var outer map[string]json.RawMessage
	if err := json.Unmarshal(js, &outer); err != nil {
		return err
	}
	specJS, statusJS := outer["spec"], outer["status"]
	delete(outer, "spec")
	delete(outer, "status")
	rest, err := json.Marshal(outer)
	if err != nil {
		return err
	}
	if err := strict(rest, obj); err != nil {
		return err
	}
	if len(specJS) > 0 && string(specJS) != "null" {
		if err := (protojson.UnmarshalOptions{}).Unmarshal(specJS, spec); err != nil {
			return fmt.Errorf("spec: %w", err)
		}
	}
	if len(statusJS) > 0 && string(statusJS) != "null" {
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(statusJS, status); err != nil {
			return fmt.Errorf("status: %w", err)
		}
	}
	return nil
}
