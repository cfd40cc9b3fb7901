package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// chartDir is the chart, relative to this package.
const chartDir = "../../charts/dam"

// release is the release name of every render.
const release = "dam-test"

// helmBin returns the helm binary: $HELM, else the newest bin/helm-* of
// the module (make helm builds it). It fails the test when there is none.
func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	found, _ := filepath.Glob("../../bin/helm-*")
	sort.Strings(found)
	if len(found) == 0 {
		t.Fatal("no helm: run `make helm` (it builds the pinned helm into bin/) or set HELM")
	}
	return found[len(found)-1]
}

// helm runs helm with args and returns its standard output, or an error
// carrying its standard error.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// ciValues returns the chart's ci/ value sets.
func ciValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci value sets in %s/ci (%v)", chartDir, err)
	}
	return files
}

// object is one rendered Kubernetes object, kept as raw YAML to decode
// into whichever shape a test needs.
type object struct {
	Kind     string
	Name     string
	Source   string
	document []byte
}

// decode decodes the object into v.
func (o object) decode(t *testing.T, v any) {
	t.Helper()
	if err := yaml.Unmarshal(o.document, v); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Name, err)
	}
}

// rendered is a release's objects by "Kind/name".
type rendered map[string]object

// get returns the object kind/name, failing the test without it.
func (r rendered) get(t *testing.T, kind, name string) object {
	t.Helper()
	o, ok := r[kind+"/"+name]
	if !ok {
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		t.Fatalf("no %s/%s rendered; got %v", kind, name, keys)
	}
	return o
}

// render runs helm template with the given value files and --set
// arguments ("key=value"; "json:key=value" for --set-json).
func render(t *testing.T, files []string, sets ...string) (rendered, error) {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", "dam-ns"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	for _, s := range sets {
		if j, ok := strings.CutPrefix(s, "json:"); ok {
			args = append(args, "--set-json", j)
		} else {
			args = append(args, "--set", s)
		}
	}
	out, err := helm(t, args...)
	if err != nil {
		return nil, err
	}
	return parse(t, out), nil
}

// mustRender is render failing the test on error.
func mustRender(t *testing.T, files []string, sets ...string) rendered {
	t.Helper()
	r, err := render(t, files, sets...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// parse splits helm's output into objects, each required to have a kind
// and a name, and no two the same.
func parse(t *testing.T, out string) rendered {
	t.Helper()
	r := rendered{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var node yaml.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, out)
		}
		if len(node.Content) == 0 {
			continue
		}
		doc, err := yaml.Marshal(&node)
		if err != nil {
			t.Fatal(err)
		}
		var head struct {
			Kind     string `yaml:"kind"`
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		if head.Kind == "" || head.Metadata.Name == "" {
			t.Fatalf("rendered object without kind or name:\n%s", doc)
		}
		key := head.Kind + "/" + head.Metadata.Name
		if _, dup := r[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		r[key] = object{Kind: head.Kind, Name: head.Metadata.Name, document: doc}
	}
	return r
}

// The shapes of the objects the tests look into: only the fields they
// assert on.
type (
	deployment struct {
		Spec struct {
			Replicas int `yaml:"replicas"`
			Template struct {
				Metadata struct {
					Annotations map[string]string `yaml:"annotations"`
				} `yaml:"metadata"`
				Spec podSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	podSpec struct {
		TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
		AutomountServiceAccountToken  *bool       `yaml:"automountServiceAccountToken"`
		SecurityContext               podSecurity `yaml:"securityContext"`
		InitContainers                []container `yaml:"initContainers"`
		Containers                    []container `yaml:"containers"`
		Volumes                       []volume    `yaml:"volumes"`
	}
	podSecurity struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
		RunAsUser    int   `yaml:"runAsUser"`
		FSGroup      int   `yaml:"fsGroup"`
	}
	container struct {
		Name            string               `yaml:"name"`
		Image           string               `yaml:"image"`
		Args            []string             `yaml:"args"`
		Env             []envVar             `yaml:"env"`
		VolumeMounts    []volumeMount        `yaml:"volumeMounts"`
		Ports           []port               `yaml:"ports"`
		LivenessProbe   *probe               `yaml:"livenessProbe"`
		ReadinessProbe  *probe               `yaml:"readinessProbe"`
		SecurityContext *containerSecurity   `yaml:"securityContext"`
		Resources       map[string]resources `yaml:"resources"`
	}
	resources map[string]string
	envVar    struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	}
	volumeMount struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	}
	port struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	}
	probe struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
		PeriodSeconds    int `yaml:"periodSeconds"`
		FailureThreshold int `yaml:"failureThreshold"`
	}
	containerSecurity struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
			Add  []string `yaml:"add"`
		} `yaml:"capabilities"`
		Privileged *bool `yaml:"privileged"`
	}
	volume struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		Secret *struct {
			SecretName  string `yaml:"secretName"`
			DefaultMode int    `yaml:"defaultMode"`
			Items       []struct {
				Key  string `yaml:"key"`
				Path string `yaml:"path"`
			} `yaml:"items"`
		} `yaml:"secret"`
	}
	configMap struct {
		Data map[string]string `yaml:"data"`
	}
)

// deploymentOf decodes the release's Deployment.
func deploymentOf(t *testing.T, r rendered, name string) deployment {
	t.Helper()
	var d deployment
	r.get(t, "Deployment", name).decode(t, &d)
	if len(d.Spec.Template.Spec.Containers) != 1 || d.Spec.Template.Spec.Containers[0].Name != "dam" {
		t.Fatalf("want one container named dam, got %+v", d.Spec.Template.Spec.Containers)
	}
	return d
}

// damContainer returns the dam container of d.
func (d deployment) dam() container { return d.Spec.Template.Spec.Containers[0] }

// env returns the container's variable name, or nil.
func (c container) env(name string) *envVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// damConfig returns the dam.yaml the release's ConfigMap holds, raw.
func damConfig(t *testing.T, r rendered, name string) string {
	t.Helper()
	var cm configMap
	r.get(t, "ConfigMap", name).decode(t, &cm)
	text, ok := cm.Data["dam.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no dam.yaml: %v", name, cm.Data)
	}
	return text
}
