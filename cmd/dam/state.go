package main

import "github.com/spf13/cobra"

// TODO(owner of this file): replace this placeholder with the real command.
func newStateCmd() *cobra.Command {
	return &cobra.Command{Use: "state", Short: "(not yet built)", Hidden: true}
}
