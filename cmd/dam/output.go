package main

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"
)

// addOutputFlag adds -o/--output text|json to a command.
func addOutputFlag(cmd *cobra.Command) {
	cmd.Flags().StringP("output", "o", "text", "output format: text or json (for scripts)")
}

// outputJSON reports whether -o json was given; another value than text
// or json is a usage error.
func outputJSON(cmd *cobra.Command) (bool, error) {
	o, _ := cmd.Flags().GetString("output")
	switch o {
	case "text":
		return false, nil
	case "json":
		return true, nil
	}
	return false, usagef("--output %q: want text or json", o)
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
