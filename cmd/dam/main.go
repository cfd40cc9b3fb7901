// Command dam is the sidecar that stops duplicate projections before they
// reach an adapter, and the operator's tool around it.
//
// Subcommands: run, check, serve, migrate, demo, playground, hash, explain,
// analyze, tap, top, state, config, version. Exit status is 0 on success, 1
// on a runtime failure and 2 on a usage or configuration error.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// usageError marks an error that is the caller's fault (bad flags, bad
// configuration): exit status 2 instead of 1.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usage error (exit status 2).
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "dam",
		Short:         "dam stops duplicate projections before they reach an adapter",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Flag parsing errors are usage errors.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newHashCmd(),
		newExplainCmd(),
		newAnalyzeCmd(),
		newTapCmd(),
		newTopCmd(),
		newMigrateCmd(),
		newStateCmd(),
		newConfigCmd(),
		newRunCmd(),
		newCheckCmd(),
		newServeCmd(),
		newDemoCmd(),
		newPlaygroundCmd(),
		newVersionCmd(),
	)
	return root
}

// run executes the command line and returns the process exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(stdin, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	var exit exitStatus
	if errors.As(err, &exit) {
		return int(exit)
	}
	fmt.Fprintf(stderr, "dam: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsageError(cmd, err) {
		return 2
	}
	return 1
}

// exitStatus is returned by a command that already reported its failure and
// only wants a particular exit status.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// isCobraUsageError recognises cobra's own failures, which it does not type:
// an unknown subcommand (reported against a command that cannot run) and an
// argument-count error from a validator wrapped by argsUsage.
func isCobraUsageError(cmd *cobra.Command, _ error) bool {
	return cmd == nil || !cmd.Runnable()
}

// argsUsage wraps a cobra positional-argument validator so that its failure
// is a usage error (exit status 2).
func argsUsage(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}

func main() {
	stop := cpuProfile()
	code := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
