package main

import "github.com/spf13/cobra"

// TODO(owner of this file): replace this placeholder with the real command.
func newConfigCmd() *cobra.Command {
	return &cobra.Command{Use: "config", Short: "(not yet built)", Hidden: true}
}
