package main

import (
	"github.com/spf13/cobra"
)

// checkService refuses a service that no route and no serve token of the
// --config file names, listing the known ones: a typo must not read or
// change state that nothing decides with (reset 0 identities, exit 0).
// Without --config (a bare --dsn) there is nothing to check against.
func checkService(cmd *cobra.Command, service string) error {
	path, _ := cmd.Flags().GetString("config")
	if path == "" {
		return nil
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return err
	}
	if err := cfg.CheckService(service); err != nil {
		return usagef("%v", err)
	}
	return nil
}
