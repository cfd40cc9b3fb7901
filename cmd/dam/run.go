package main

import "github.com/spf13/cobra"

// TODO(owner of this file): replace this placeholder with the real command.
func newRunCmd() *cobra.Command {
	return &cobra.Command{Use: "run", Short: "(not yet built)", Hidden: true}
}
