package main

import "github.com/spf13/cobra"

// TODO(owner of this file): replace this placeholder with the real command.
func newDemoCmd() *cobra.Command {
	return &cobra.Command{Use: "demo", Short: "(not yet built)", Hidden: true}
}
