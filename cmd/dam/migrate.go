package main

import "github.com/spf13/cobra"

// TODO(owner of this file): replace this placeholder with the real command.
func newMigrateCmd() *cobra.Command {
	return &cobra.Command{Use: "migrate", Short: "(not yet built)", Hidden: true}
}
