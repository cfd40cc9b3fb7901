package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/internal/progress"
)

func addProgressFlag(cmd *cobra.Command) {
	cmd.Flags().String("progress", progress.Auto, "progress on stderr: auto (a bar on a terminal, plain lines otherwise), bar, lines or none")
}

// newProgress returns the reporter --progress asks for, writing to the
// command's stderr; terminal decides auto.
func newProgress(cmd *cobra.Command, what, unit string, terminal func(io.Writer) bool) (*progress.Reporter, error) {
	mode, _ := cmd.Flags().GetString("progress")
	w := cmd.ErrOrStderr()
	pr, err := progress.New(w, mode, what, unit, terminal(w))
	if err != nil {
		return nil, usagef("--progress %q: %v", mode, err)
	}
	return pr, nil
}
