package pluginhost

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
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
	d, err := os.Open(root)
	if err != nil {
		return false, fmt.Errorf("scan processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return false, fmt.Errorf("scan processes in %s: %w", root, err)
	}
	for _, n := range names {
		if n == "" || n[0] < '0' || n[0] > '9' {
			continue
		}
		b, err := os.ReadFile(root + "/" + n + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		st, err := parseProcStat(b)
		if err != nil {
			continue
		}
		if st.pgrp == pgid && st.state != 'Z' && st.state != 'X' && st.state != 'x' {
			return true, nil
		}
	}
	return false, nil
}

// procStat is what the host reads of /proc/<pid>/stat.
type procStat struct {
	pid   int
	state byte
	pgrp  int
}

// parseProcStat decodes the fields pid, state and pgrp of a
// /proc/<pid>/stat line: "pid (comm) state ppid pgrp ...", where comm may
// itself hold spaces and parentheses, so the fields after it are found
// after the last ')'.
func parseProcStat(b []byte) (procStat, error) {
	var st procStat
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return st, fmt.Errorf("proc stat %.40q: no (comm)", b)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return st, fmt.Errorf("proc stat %.40q: pid: %w", b, err)
	}
	f := bytes.Fields(b[end+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return st, fmt.Errorf("proc stat %.40q: want state, ppid and pgrp after the comm", b)
	}
	pgrp, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return st, fmt.Errorf("proc stat %.40q: pgrp: %w", b, err)
	}
	st.pid, st.state, st.pgrp = pid, f[0][0], pgrp
	return st, nil
}
