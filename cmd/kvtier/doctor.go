package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/kvtier/kvtier/host/doctor"
	"github.com/spf13/cobra"
)

// errChecksFailed marks a doctor run with a failed check: exit status 1,
// the report already printed.
var errChecksFailed = errors.New("checks failed")

// doctorWith runs `kvtier doctor args...` on the machine sys.
func doctorWith(ctx context.Context, args []string, stdout, stderr io.Writer, sys doctor.System) error {
	root := newRootCmd()
	for _, c := range root.Commands() {
		if c.Name() == "doctor" {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(newDoctorCmd(sys))
	return execute(ctx, root, append([]string{"doctor"}, args...), stdout, stderr)
}

// newDoctorCmd returns `kvtier doctor` on the machine sys.
func newDoctorCmd(sys doctor.System) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor [flags]",
		Short: "check this machine against a stack config before serving",
		Long: `Checks this machine against a stack config before kvtier serve runs on it:
hugepages and the hugetlbfs mount against the L2 slab, the memlock limit,
O_DIRECT, power-loss protection (fdatasync latency) and free space on each
L3 disk, the LMDB map size, the API socket and the plugin pins. The API
socket is the unix socket serve listens on (--socket; default serve's own,
kvtier.sock in its default --data-dir): free, a stale file a dead serve left
(serve removes it), or held by a live serve that answers; and its directory.
Each check passes, warns or fails with what to run or change. Exits 1 when a
check fails; warnings exit 0. The O_DIRECT and power-loss probes write a
scratch file in each L3 directory (or its nearest existing parent) and remove it.`,
		Example: `  kvtier doctor
  kvtier config default --serve > stack.yaml && kvtier doctor --config stack.yaml --socket /tmp/kvtier.sock --json`,
	}
	fs := cmd.Flags()
	cfgPath := fs.String("config", "", "stack config `file` (default: the embedded default stack; serve's placeholders expanded as serve would, {{DIR}} = --data-dir)")
	dataDir := fs.String("data-dir", "", "serve's --data-dir `dir`: what a config's {{DIR}} stands for, and where serve's default socket is (default: $XDG_STATE_HOME/kvtier or ~/.local/state/kvtier)")
	socket := fs.String("socket", "", "the unix socket `path` serve will listen on (default: serve's, kvtier.sock in --data-dir)")
	asJSON := fs.Bool("json", false, "print one JSON object {checks: [{name, status, message, detail}], ok}")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		stdout := cmd.OutOrStdout()
		if fs.NArg() > 0 {
			return fmt.Errorf("doctor: unexpected arguments %q: %w", fs.Args(), errUsage)
		}
		st, _, err := configLoadStack(*cfgPath, serveView{dataDir: *dataDir})
		if err != nil {
			return fmt.Errorf("doctor: %w", err)
		}
		sock := *socket
		if sock == "" {
			dir, err := serveDataDir(*dataDir)
			if err != nil {
				return fmt.Errorf("doctor: %w (pass --socket)", err)
			}
			sock = serveSocketIn(dir)
		}
		rep := doctor.RunOptions(ctx, st, sys, doctor.Options{Socket: sock})
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(rep); err != nil {
				return fmt.Errorf("doctor: write json: %w", err)
			}
		} else {
			writeDoctorReport(stdout, rep, *cfgPath)
		}
		if !rep.OK {
			_, _, failed := rep.Counts()
			return fmt.Errorf("doctor: %d of %d %w", failed, len(rep.Checks), errChecksFailed)
		}
		return nil
	}
	return cmd
}

// writeDoctorReport prints one line per check and a summary.
func writeDoctorReport(w io.Writer, rep doctor.Report, cfgPath string) {
	width := 0
	for _, c := range rep.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range rep.Checks {
		fmt.Fprintf(w, "%-4s  %-*s  %s\n", strings.ToUpper(string(c.Status)), width, c.Name, c.Message)
	}
	if cfgPath == "" {
		cfgPath = "the embedded default stack"
	}
	pass, warn, fail := rep.Counts()
	fmt.Fprintf(w, "doctor: %d pass, %d warn, %d fail (%s)\n", pass, warn, fail, cfgPath)
}
