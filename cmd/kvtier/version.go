package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
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

func runVersion(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version takes no arguments: %w", errUsage)
	}
	ver, rev := buildVersion()
	fmt.Fprintf(stdout, "kvtier %s (module github.com/kvtier/kvtier, revision %s)\n", ver, rev)
	return nil
}
