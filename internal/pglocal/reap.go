package pglocal

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A cluster's directory is os.TempDir()/dam-pglocal-*; its file owner
// names the process that started it ("PID STARTTIME", the start time from
// /proc/PID/stat so that a reused PID is not mistaken for the owner).
//
// A process that exits without Stop (os.Exit from log.Fatal, a test
// binary killed by its -timeout, SIGKILL) leaves its servers running and
// its directories behind, three of each for a Citus cluster. The first
// Start of each process stops and removes those of owners that have
// exited.
const (
	dirPrefix = "dam-pglocal-"
	ownerFile = "owner"
)

var reapOnce sync.Once

func writeOwner(dir string) error {
	pid := os.Getpid()
	start, _ := procStart(pid)
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(fmt.Sprintf("%d %s\n", pid, start)), 0o644); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	return nil
}

// procStart returns the start time of process pid (field 22 of
// /proc/PID/stat, in clock ticks since boot), or an error if there is no
// such process or no /proc.
func procStart(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", fmt.Errorf("pglocal: /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 20 {
		return "", fmt.Errorf("pglocal: /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f[19], nil
}

// ownerGone reports whether the process that made dir has exited. A
// directory without an owner file (being made now, or made by an older
// pglocal) is never taken for an orphan.
func ownerGone(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return false
	}
	start, err := procStart(pid)
	return os.IsNotExist(err) || (err == nil && start != f[1])
}

// reapOrphans stops the servers of the clusters whose owner has exited
// (immediate shutdown, as Stop does) and removes their directories. It
// works only with /proc (Linux); elsewhere it does nothing.
func reapOrphans(logf func(string, ...any)) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		if !ownerGone(dir) {
			continue
		}
		if err := stopOrphan(dir); err != nil {
			logf("pglocal: leaving %s, made by a process that has exited: %v", dir, err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logf("pglocal: %v", err)
			continue
		}
		logf("pglocal: removed %s, left by a process that exited without stopping it", dir)
	}
}

// stopOrphan stops the server running on dir's data, if one is.
func stopOrphan(dir string) error {
	data := filepath.Join(dir, "data")
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if os.IsNotExist(err) {
		return nil // not running (never started, Kill, or stopped)
	}
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return fmt.Errorf("postmaster.pid: %q", lines[0])
	}
	// Signal only that postmaster: a process of that PID whose command
	// line names this data directory (pg_ctl starts it with -D data).
	alive := func() bool {
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && strings.Contains(string(cmd), data)
	}
	if !alive() {
		return nil
	}
	// SIGQUIT: immediate shutdown, as pg_ctl stop -m immediate.
	if err := syscall.Kill(pid, syscall.SIGQUIT); err != nil {
		return fmt.Errorf("stopping postmaster %d: %w", pid, err)
	}
	for deadline := time.Now().Add(10 * time.Second); alive(); {
		if time.Now().After(deadline) {
			return fmt.Errorf("postmaster %d did not stop within 10s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
