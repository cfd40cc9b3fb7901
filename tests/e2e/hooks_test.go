package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dam-dedup/dam/internal/testutil/damproc"
)

// The production binary (go build ./cmd/dam, without the damtest tag)
// carries none of the test hooks (such as DAM_TEST_CPUPROFILE, which
// writes a file, and DAM_TEST_PAUSE_AT, which makes dam SIGSTOP itself):
// their variables are not in it, and setting them does nothing. The suite's own
// binary (damBin) has them.
func TestProductionBinaryHasNoTestHooks(t *testing.T) {
	t.Parallel()
	needBinary(t)
	dir := t.TempDir()
	prod, err := damproc.Build(damproc.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hooks := []string{"DAM_TEST_PAUSE_AT", "DAM_TEST_CPUPROFILE"}
	for _, bin := range []struct {
		path string
		want bool
	}{{prod, false}, {damBin, true}} {
		b, err := os.ReadFile(bin.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hooks {
			if got := bytes.Contains(b, []byte(h)); got != bin.want {
				t.Errorf("%s holds %s: %v, want %v", bin.path, h, got, bin.want)
			}
		}
	}
	profile := filepath.Join(dir, "cpu.prof")
	cmd := exec.Command(prod, "version")
	cmd.Env = append(os.Environ(), "DAM_TEST_CPUPROFILE="+profile, "DAM_TEST_PAUSE_AT=decided")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dam") {
		t.Fatalf("dam version with the hooks' variables: %v\n%s", err, out)
	}
	if _, err := os.Stat(profile); !os.IsNotExist(err) {
		t.Fatalf("the production binary wrote %s (DAM_TEST_CPUPROFILE): %v", profile, err)
	}
}
