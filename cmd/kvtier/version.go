package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set by the Makefile through -ldflags "-X main.version=... -X main.revision=...".
var (
	version  = ""
	revision = ""
)

// buildVersion returns the module version and VCS revision, preferring the
// ldflags values and falling back to the embedded build info.
func buildVersion() (ver, rev string) {
	ver, rev = version, revision
	if info, ok := debug.ReadBuildInfo(); ok {
		if ver == "" {
			ver = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && rev == "" {
				rev = s.Value
			}
		}
	}
	if ver == "" {
		ver = "(devel)"
	}
	if rev == "" {
		rev = "unknown"
	}
	return ver, rev
}

// newVersionCmd returns `kvtier version`.
func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "print the module version and VCS revision",
		Example: "  kvtier version",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ver, rev := buildVersion()
			fmt.Fprintf(cmd.OutOrStdout(), "kvtier %s (module github.com/kvtier/kvtier, revision %s)\n", ver, rev)
			return nil
		},
	}
}
