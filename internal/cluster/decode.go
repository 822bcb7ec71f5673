package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	k := byGroupKind[schema.GroupKind{Group: group, Kind: tm.Kind}]
	if k == nil && ignoredKind(group, tm.Kind) {
		ns := tm.Metadata.Namespace
		if ns == "" {
			ns = "default"
		}
		o.Ignored = append(o.Ignored, &IgnoredObject{APIVersion: tm.APIVersion, Kind: tm.Kind, Namespace: ns, Name: tm.Metadata.Name})
		return nil
	}
	if k == nil {
		return []error{derr(fmt.Errorf("%w %s %s", ErrUnsupportedKind, tm.APIVersion, tm.Kind))}
	}
	v, err := k.decode(js)
	if err != nil {
		return []error{derr(err)}
	}
	if k.Namespaced && v.GetNamespace() == "" {
		v.SetNamespace("default")
	}
	k.add(o, v)
	return nil
}

// strictAs is strict for one typed object (a kinds table decoder).
func strictAs[T any](js []byte, v T) error { return strict(js, v) }

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
		if specJS, err = goDurations(specJS, spec.ProtoReflect().Descriptor()); err != nil {
			return fmt.Errorf("spec: %w", err)
		}
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
