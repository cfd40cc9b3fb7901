package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
)

// buildDam builds dam (see damproc.Build).
func buildDam(t *testing.T) string {
	t.Helper()
	bin, err := damproc.Build(damproc.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// damConfigCheck runs `dam config` the way the rendered pod would: on the
// ConfigMap's dam.yaml, with the dam container's environment, the Secret's
// keys present (as files where the Deployment mounts them, under a
// temporary directory, or as variables). It returns the exit status and
// the output.
func damConfigCheck(t *testing.T, dam string, r rendered) (int, string) {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "dam.yaml")
	if err := os.WriteFile(cfgPath, []byte(damConfig(t, r, "dam-test")), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := deploymentOf(t, r, "dam-test").Spec.Template.Spec
	c := spec.Containers[0]
	if !strings.HasSuffix(strings.Join(c.Args, " "), "--config /etc/dam/dam.yaml") {
		t.Fatalf("dam's args %v: want --config /etc/dam/dam.yaml", c.Args)
	}

	// The Secret's keys, as the kubelet would project them.
	secretDirs := map[string]string{} // mount path -> local directory
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name != v.Name {
				continue
			}
			local := filepath.Join(dir, "secret-"+v.Name)
			if err := os.MkdirAll(local, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, it := range v.Secret.Items {
				if err := os.WriteFile(filepath.Join(local, it.Path), []byte(secretValue(it.Key)+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			secretDirs[m.MountPath] = local
		}
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env = append(env, e.Name+"="+secretValue(e.ValueFrom.SecretKeyRef.Key))
		case e.ValueFrom != nil:
			t.Fatalf("env %s from something other than a Secret", e.Name)
		default:
			v := e.Value
			for mount, local := range secretDirs {
				if rest, ok := strings.CutPrefix(v, mount+"/"); ok {
					v = filepath.Join(local, rest)
				}
			}
			env = append(env, e.Name+"="+v)
		}
	}
	cmd := exec.Command(dam, "config", "--config", cfgPath)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String()
}

// secretValue is what the test's Secret holds under key: a DSN for keys
// naming one, a password otherwise.
func secretValue(key string) string {
	if strings.Contains(key, "dsn") {
		return "postgres://dam:s3cret-" + key + "@postgres:5432/dam?search_path=dam"
	}
	return "pw-" + key
}

// TestDamAcceptsRenderedConfig feeds the configuration the chart renders
// for every ci/ value set to `dam config`: a chart rendering a
// configuration dam refuses fails here.
func TestDamAcceptsRenderedConfig(t *testing.T) {
	dam := buildDam(t)
	for _, f := range ciValues(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := mustRender(t, []string{f})
			code, out := damConfigCheck(t, dam, r)
			if code != 0 {
				t.Fatalf("dam config exited %d:\n%s", code, out)
			}
			if strings.Contains(out, "s3cret") || strings.Contains(out, "pw-") {
				t.Errorf("dam config printed a secret:\n%s", out)
			}
			if !strings.Contains(out, "service: ") {
				t.Errorf("no routes in dam config's output:\n%s", out)
			}
			// The DSN reached dam: named by its file, or redacted.
			if !strings.Contains(out, "dsn_file: /") && !strings.Contains(out, "dsn: postgres://dam:xxxxx@postgres:5432/dam") {
				t.Errorf("no DSN in dam config's output:\n%s", out)
			}
		})
	}
}

// TestDamRefusesBadRenderedConfig: the check above can fail. The chart's
// schema lets each timeout through on its own; dam refuses their order.
func TestDamRefusesBadRenderedConfig(t *testing.T) {
	r := mustRender(t, minimalValues, "config.postgres.lock_timeout=40s")
	code, out := damConfigCheck(t, buildDam(t), r)
	if code != 2 || !strings.Contains(out, "postgres.lock_timeout: 40s must be below kafka.transaction_timeout") {
		t.Fatalf("dam config exited %d, want 2 naming postgres.lock_timeout:\n%s", code, out)
	}
}
