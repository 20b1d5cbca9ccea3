package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/kvtier/kvtier/host/doctor"
)

// errChecksFailed marks a doctor run with a failed check: exit status 1,
// the report already printed.
var errChecksFailed = errors.New("checks failed")

const doctorUsage = `usage: kvtier doctor [--config FILE] [--socket PATH] [--json]

Checks this machine against a stack config before kvtier serve runs on it:
hugepages and the hugetlbfs mount against the L2 slab, the memlock limit,
O_DIRECT, power-loss protection (fdatasync latency) and free space on each
L3 disk, the LMDB map size, the API socket and the plugin pins. The API
socket is the unix socket serve listens on (--socket; default serve's own,
kvtier.sock in its default --data-dir): free, a stale file a dead serve left
(serve removes it), or held by a live serve that answers; and its directory.
Each check passes, warns or fails with what to run or change. Exits 1 when a
check fails; warnings exit 0. The O_DIRECT and power-loss probes write a
scratch file in each L3 directory (or its nearest existing parent) and remove it.

flags:
`

// runDoctor implements `kvtier doctor`.
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return doctorWith(ctx, args, stdout, stderr, doctor.OS{})
}

// doctorWith is runDoctor on the machine sys.
func doctorWith(ctx context.Context, args []string, stdout, stderr io.Writer, sys doctor.System) error {
	fs := flag.NewFlagSet("kvtier doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "stack config `file` (default: the embedded default stack)")
	socket := fs.String("socket", "", "the unix socket `path` serve will listen on (default: serve's, DIR/kvtier.sock under $XDG_STATE_HOME/kvtier or ~/.local/state/kvtier)")
	asJSON := fs.Bool("json", false, "print one JSON object {checks: [{name, status, message, detail}], ok}")
	fs.Usage = func() {
		fmt.Fprint(stderr, doctorUsage)
		fs.PrintDefaults()
	}
	if err := parseInterspersed(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("doctor: %w: %w", err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("doctor: unexpected arguments %q: %w", fs.Args(), errUsage)
	}
	st, err := configLoadStack(*cfgPath)
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	sock := *socket
	if sock == "" {
		dir, err := defaultServeDataDir()
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
