package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every command that reads a configuration file takes it as --config or
// -c, the same on all of them.
func TestConfigFlagShorthandEverywhere(t *testing.T) {
	var walk func(*cobra.Command)
	seen := 0
	walk = func(cmd *cobra.Command) {
		f := cmd.Flags().Lookup("config")
		if f == nil {
			f = cmd.PersistentFlags().Lookup("config")
		}
		if f != nil {
			seen++
			if f.Shorthand != "c" {
				t.Errorf("dam %s: --config has no -c", strings.TrimPrefix(cmd.CommandPath(), "dam "))
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd(strings.NewReader(""), io.Discard, io.Discard))
	if seen < 5 {
		t.Fatalf("only %d commands have --config", seen)
	}
}
