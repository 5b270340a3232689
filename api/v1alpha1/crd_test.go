package v1alpha1_test

import (
	"bytes"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/deploy"
)

// helmCRD is the Helm chart's copy of deploy/base/jobrecord-crd.yaml.
const helmCRD = "../../deploy/helm/coroner/crds/jobrecord-crd.yaml"

// crd is what the tests read of a CustomResourceDefinition.
type crd struct {
	Spec struct {
		Group string `json:"group"`
		Scope string `json:"scope"`
		Names struct {
			Kind   string `json:"kind"`
			Plural string `json:"plural"`
		} `json:"names"`
		Versions []struct {
			Name   string `json:"name"`
			Schema struct {
				OpenAPIV3Schema schema `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// schema is the part of a structural schema the Go type determines.
type schema struct {
	Type                 string            `json:"type"`
	Format               string            `json:"format"`
	Required             []string          `json:"required"`
	Properties           map[string]schema `json:"properties"`
	AdditionalProperties *schema           `json:"additionalProperties"`
	Items                *schema           `json:"items"`
	Enum                 []string          `json:"enum"`
}

// TestCRDCopies: the Helm chart installs the same CRD as the kustomize base.
func TestCRDCopies(t *testing.T) {
	helm, err := os.ReadFile(helmCRD)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(deploy.JobRecordCRD, helm) {
		t.Errorf("%s differs from deploy/base/jobrecord-crd.yaml: copy the base over it", helmCRD)
	}
}

// TestCRDMatchesJobRecord: the CRD's schema of the JobRecord is the Go type's JSON, both
// ways: every property the Go type writes is in the schema with its type (and format for
// integers and times), every property of the schema is a field of the Go type, and a
// property is required exactly when the Go field is written always (no omitempty). An
// API server prunes what the schema lacks, so a field added to the type and not to the
// CRD would be written and silently lost.
func TestCRDMatchesJobRecord(t *testing.T) {
	for _, c := range []struct{ name, yaml string }{{"deploy/base/jobrecord-crd.yaml", string(deploy.JobRecordCRD)}, {helmCRD, ""}} {
		t.Run(c.name, func(t *testing.T) {
			b := []byte(c.yaml)
			if c.yaml == "" {
				var err error
				if b, err = os.ReadFile(c.name); err != nil {
					t.Fatal(err)
				}
			}
			var d crd
			if err := yaml.Unmarshal(b, &d); err != nil {
				t.Fatal(err)
			}
			if d.Spec.Group != v1alpha1.Group || d.Spec.Names.Kind != v1alpha1.Kind || d.Spec.Names.Plural != v1alpha1.Resource || d.Spec.Scope != "Namespaced" {
				t.Errorf("group %q kind %q plural %q scope %q; want %q %q %q Namespaced", d.Spec.Group, d.Spec.Names.Kind, d.Spec.Names.Plural, d.Spec.Scope, v1alpha1.Group, v1alpha1.Kind, v1alpha1.Resource)
			}
			if len(d.Spec.Versions) != 1 || d.Spec.Versions[0].Name != v1alpha1.Version {
				t.Fatalf("versions %+v; want the one %s", d.Spec.Versions, v1alpha1.Version)
			}
			for _, p := range drift(reflect.TypeFor[v1alpha1.JobRecord](), d.Spec.Versions[0].Schema.OpenAPIV3Schema, "") {
				t.Error(p)
			}
		})
	}
}

// TestDriftIsSeen: drift finds a field the schema lacks, a property the type lacks, a
// wrong type and a wrong required list.
func TestDriftIsSeen(t *testing.T) {
	type inner struct {
		A int32 `json:"a"`
	}
	type obj struct {
		Name  string           `json:"name"`
		Count *int64           `json:"count,omitempty"`
		When  metav1.Time      `json:"when,omitempty"`
		Inner map[string]inner `json:"inner,omitempty"`
		Extra string           `json:"extra,omitempty"`
	}
	s := schema{Type: "object", Required: []string{"name", "count"}, Properties: map[string]schema{
		"name":  {Type: "string"},
		"count": {Type: "integer", Format: "int32"},
		"when":  {Type: "string", Format: "date-time"},
		"inner": {Type: "object", AdditionalProperties: &schema{Type: "object", Properties: map[string]schema{"a": {Type: "integer", Format: "int32"}, "b": {Type: "string"}}}},
	}}
	got := strings.Join(drift(reflect.TypeFor[obj](), s, ""), "\n")
	for _, want := range []string{".extra: in the Go type, not in the CRD", ".count: format \"int32\", the Go type's is \"int64\"", ".inner.*.b: in the CRD, not in the Go type", "required [count name], the Go type's [name]", ".inner.*: required [], the Go type's [a]"} {
		if !strings.Contains(got, want) {
			t.Errorf("drift missed %q; found:\n%s", want, got)
		}
	}
}

var (
	timeType     = reflect.TypeFor[metav1.Time]()
	objectMeta   = reflect.TypeFor[metav1.ObjectMeta]()
	outcomeType  = reflect.TypeFor[v1alpha1.Outcome]()
	outcomeEnums = []string{string(v1alpha1.OutcomeSucceeded), string(v1alpha1.OutcomeFailed), string(v1alpha1.OutcomeIgnored), string(v1alpha1.OutcomeDeleted)}
)

// drift lists the differences between Go type t, as encoding/json writes it, and schema s
// at path.
func drift(t reflect.Type, s schema, path string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	where := path
	if where == "" {
		where = "the JobRecord"
	}
	kind := func(typ, format string) {
		if s.Type != typ {
			out = append(out, where+": type "+q(s.Type)+", the Go type's is "+q(typ))
		} else if s.Format != format {
			out = append(out, where+": format "+q(s.Format)+", the Go type's is "+q(format))
		}
	}
	switch {
	case t == timeType:
		kind("string", "date-time")
	case t == objectMeta:
		kind("object", "") // the API server's own schema
	case t.Kind() == reflect.String:
		kind("string", "")
		if t == outcomeType && !slices.Equal(s.Enum, outcomeEnums) {
			out = append(out, where+": enum "+strings.Join(s.Enum, ",")+", the Go type's "+strings.Join(outcomeEnums, ","))
		}
	case t.Kind() == reflect.Bool:
		kind("boolean", "")
	case t.Kind() == reflect.Int32:
		kind("integer", "int32")
	case t.Kind() == reflect.Int64 || t.Kind() == reflect.Int:
		kind("integer", "int64")
	case t.Kind() == reflect.Float64 || t.Kind() == reflect.Float32:
		kind("number", "")
	case t.Kind() == reflect.Slice:
		kind("array", "")
		if s.Items == nil {
			return append(out, where+": an array without items")
		}
		out = append(out, drift(t.Elem(), *s.Items, path+"[]")...)
	case t.Kind() == reflect.Map:
		kind("object", "")
		if len(s.Properties) > 0 || s.AdditionalProperties == nil {
			return append(out, where+": a map in the Go type, not additionalProperties in the CRD")
		}
		out = append(out, drift(t.Elem(), *s.AdditionalProperties, path+".*")...)
	case t.Kind() == reflect.Struct:
		kind("object", "")
		fields := map[string]reflect.Type{}
		var required []string
		jsonFields(t, fields, &required)
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			sub, ok := s.Properties[name]
			if !ok {
				out = append(out, path+"."+name+": in the Go type, not in the CRD")
				continue
			}
			out = append(out, drift(fields[name], sub, path+"."+name)...)
		}
		for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
			if _, ok := fields[name]; !ok {
				out = append(out, path+"."+name+": in the CRD, not in the Go type")
			}
		}
		slices.Sort(required)
		have := slices.Sorted(slices.Values(s.Required))
		if !slices.Equal(have, required) {
			out = append(out, where+": required ["+strings.Join(have, " ")+"], the Go type's ["+strings.Join(required, " ")+"]")
		}
	default:
		out = append(out, where+": Go kind "+t.Kind().String()+" has no schema type here")
	}
	return out
}

// jsonFields collects the JSON properties of struct t as encoding/json writes them
// (embedded structs without a name inlined, "-" skipped), and those written always.
func jsonFields(t reflect.Type, fields map[string]reflect.Type, required *[]string) {
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			jsonFields(f.Type, fields, required)
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
		optional := slices.ContainsFunc(strings.Split(opts, ","), func(o string) bool { return o == "omitempty" || o == "omitzero" || o == "inline" })
		if !optional {
			*required = append(*required, name)
		}
	}
}

func q(s string) string { return `"` + s + `"` }
