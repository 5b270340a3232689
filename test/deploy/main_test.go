package deploy

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// tool returns the path of a built tool, or skips (fails with
// CORONER_REQUIRE_DEPLOY_TOOLS=1) when it is not built.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := Tool(name)
	if err != nil {
		if os.Getenv("CORONER_REQUIRE_DEPLOY_TOOLS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return p
}

// run runs a tool in the repository's root and returns its standard output.
func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	return runTool(t, tool(t, name), args...)
}

// runTool runs the program at path in the repository's root and returns its standard output.
func runTool(t *testing.T, path string, args ...string) []byte {
	t.Helper()
	name := filepath.Base(path)
	cmd := exec.Command(path, args...)
	cmd.Dir = Root()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return out
}

// objects decodes a multi-document YAML stream, keyed "apiVersion kind namespace/name";
// empty documents (comments only) are skipped, a key seen twice fails.
func objects(t *testing.T, what string, stream []byte) map[string]*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	out := map[string]*unstructured.Unstructured{}
	for {
		var m map[string]any
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		key := u.GetAPIVersion() + " " + u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
		if _, dup := out[key]; dup {
			t.Fatalf("%s: %s twice", what, key)
		}
		out[key] = u
	}
	if len(out) == 0 {
		t.Fatalf("%s: no objects", what)
	}
	return out
}

func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Root(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
