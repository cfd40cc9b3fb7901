package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dam-dedup/dam/config"
)

func newConfigCmd() *cobra.Command {
	var path string
	var forServe bool
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Print the effective configuration, secrets redacted",
		Long: `Print the effective configuration as YAML: the defaults, overlaid by the
configuration file, overlaid by DAM_* environment variables, with the
PostgreSQL and SASL passwords and the serve tokens redacted. An invalid
configuration is reported, every problem with its key, with exit status 2.

The configuration is checked as dam run reads it; with --serve, as dam
serve reads it (kafka and routes optional, a token required).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg config.Config
			var err error
			if forServe {
				cfg, err = config.LoadServe(path, os.Environ())
				if err != nil {
					err = usageError{configError{path: path, err: err}}
				}
			} else {
				cfg, err = loadConfig(path)
				if err != nil {
					if _, serr := config.LoadServe(path, os.Environ()); serr == nil {
						err = usageError{fmt.Errorf("%w\ndam: (valid for dam serve: check it with dam config --serve)", err)}
					}
				}
			}
			if err != nil {
				return err
			}
			out, err := cfg.Redacted().YAML()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "dam.yaml", "configuration `file`")
	cmd.Flags().BoolVar(&forServe, "serve", false, "check the configuration as dam serve reads it (kafka and routes optional)")
	return cmd
}

// loadConfig loads the configuration file at path, overlaid by the process
// environment, for the commands that need it. Its error is a usage error
// (exit status 2) listing every problem, one per line, each line prefixed
// with the file name ("dam.yaml: routes[1].ignore[0]: ...") and every line
// after the first also with "dam: " to match the first, which run prints.
func loadConfig(path string) (config.Config, error) {
	cfg, err := config.Load(path, os.Environ())
	if err != nil {
		return config.Config{}, usageError{configError{path: path, err: err}}
	}
	return cfg, nil
}

// configError prefixes each of a joined error's lines with the file name.
type configError struct {
	path string
	err  error
}

func (e configError) Error() string {
	var errs []error
	if j, ok := e.err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{e.err}
	}
	lines := make([]string, len(errs))
	for i, err := range errs {
		lines[i] = fmt.Sprintf("%s: %v", e.path, err)
	}
	return strings.Join(lines, "\ndam: ")
}

func (e configError) Unwrap() error { return e.err }
