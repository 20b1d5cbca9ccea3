package pluginhost

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// A plugin runs as the leader of its own process group (Setpgid), so the
// host can end it together with every process it started: a shell wrapper
// whose child still holds the plugin's stdout, a worker it forked. go-plugin
// signals only the plugin's pid, and then reads the plugin's stdout and
// stderr until every holder has closed them, so one leftover child would
// hold the host for as long as it lives.

// killGroup sends SIGKILL to every process of process group pgid.
func killGroup(pgid int) error {
	if pgid <= 0 {
		return fmt.Errorf("process group %d: %w", pgid, syscall.EINVAL)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill process group %d: %w", pgid, err)
	}
	return nil
}

// awaitGroupGone waits until no process of group pgid can run any more
// (every member has exited; zombies count as gone, since they no longer
// have memory to write) or until d has passed, and reports whether it is
// gone.
func awaitGroupGone(pgid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	pause := 500 * time.Microsecond
	for {
		if !groupAlive(pgid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// groupAlive reports whether a process of group pgid is still running (not
// a zombie).
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false // no member at all, not even a zombie
	}
	// Members remain; they may all be zombies waiting for a reaper (the
	// leader waits for go-plugin, orphans for init), which do not count.
	alive, err := procGroupAlive("/proc", pgid)
	if err != nil {
		return true // no /proc to tell zombies apart: trust kill(2)
	}
	return alive
}

// procGroupAlive scans the /proc file system at root for a process of
// group pgid that is not a zombie.
func procGroupAlive(root string, pgid int) (bool, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return false, fmt.Errorf("scan processes: %w", err)
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return false, fmt.Errorf("scan processes in %s: %w", root, err)
	}
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil {
			continue // exited meanwhile
		}
		if st.PGRP == pgid && st.State != "Z" && st.State != "X" && st.State != "x" {
			return true, nil
		}
	}
	return false, nil
}
