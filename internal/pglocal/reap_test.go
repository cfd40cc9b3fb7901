package pglocal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestReapOrphans: a cluster whose owner process has exited is stopped and
// removed by the next process's first Start; one whose owner lives, and a
// directory without an owner file, are left alone.
func TestReapOrphans(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc: reaping works on Linux only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	orphan, err := Start(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := Start(ctx, t.Logf)
	if err != nil {
		orphan.Stop()
		t.Fatal(err)
	}
	defer kept.Stop()
	ownerless, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ownerless)

	// A process that has exited owns orphan now.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	owner := fmt.Sprintf("%d 1\n", dead.Process.Pid)
	if err := os.WriteFile(filepath.Join(orphan.dir, ownerFile), []byte(owner), 0o644); err != nil {
		t.Fatal(err)
	}
	reapOrphans(t.Logf)

	if _, err := os.Stat(orphan.dir); !os.IsNotExist(err) {
		orphan.Stop()
		t.Errorf("the orphan's directory is still there: %v", err)
	}
	if err := Reachable(ctx, orphan.DSN()); err == nil {
		t.Error("the orphan's server still answers")
	}
	if err := Reachable(ctx, kept.DSN()); err != nil {
		t.Errorf("a cluster of a live process was stopped: %v", err)
	}
	if _, err := os.Stat(ownerless); err != nil {
		t.Errorf("a directory without an owner file was removed: %v", err)
	}
}
