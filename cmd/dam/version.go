package main

import (
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// commit and date are stamped at build time, as version is (main.go), by
// the release build (.goreleaser.yaml):
//
//	-ldflags "-X main.version=0.1.0 -X main.commit=<sha> -X main.date=<RFC 3339>"
//
// A binary built without them falls back to what the Go toolchain
// recorded (see fromBuildInfo), else to "dev" and "unknown".
var (
	commit = ""
	date   = ""
)

// unknown stands for a commit or date that nobody recorded.
const unknown = "unknown"

func init() {
	version, commit, date = fromBuildInfo(version, commit, date, debug.ReadBuildInfo)
}

// fromBuildInfo fills what was not stamped from the Go toolchain's build
// information: the module version of `go install .../cmd/dam@v0.1.0`
// (never "(devel)", which a build from a checkout records), and the VCS
// revision and commit time of a build in a git checkout. What neither
// gives stays "dev" (the version) or becomes "unknown".
func fromBuildInfo(v, c, d string, read func() (*debug.BuildInfo, bool)) (string, string, string) {
	if bi, ok := read(); ok {
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && c == "":
				c = s.Value
			case s.Key == "vcs.time" && d == "":
				d = s.Value
			}
		}
	}
	if c == "" {
		c = unknown
	}
	if d == "" {
		d = unknown
	}
	return v, c, d
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print dam's version, commit and build date",
		Long: `Print dam's version, the commit it was built from and that commit's date
(stamped by the release build), then the Go version and platform:

  dam 0.1.0 (commit 21d63c3..., 2026-11-24T13:00:00Z) go1.26.8 linux/amd64`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.Printf("dam %s (commit %s, %s) %s %s/%s\n", version, commit, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
