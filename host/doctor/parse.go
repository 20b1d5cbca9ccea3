package doctor

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// meminfo holds the hugepage lines of /proc/meminfo.
type meminfo struct {
	hugeTotal, hugeFree, hugeRsvd int64
	// hugepageSize is the default hugepage size in bytes.
	hugepageSize int64
}

// maxMeminfoLines bounds the lines parseMeminfo reads: /proc/meminfo has
// about 60.
const maxMeminfoLines = 4096

// parseMeminfo reads the HugePages_Total, HugePages_Free, HugePages_Rsvd
// and Hugepagesize lines of /proc/meminfo. Errors name the line.
func parseMeminfo(b []byte) (meminfo, error) {
	var m meminfo
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		if n > maxMeminfoLines {
			return m, fmt.Errorf("more than %d lines", maxMeminfoLines)
		}
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		unit := int64(1)
		switch key {
		case "HugePages_Total":
			dst = &m.hugeTotal
		case "HugePages_Free":
			dst = &m.hugeFree
		case "HugePages_Rsvd":
			dst = &m.hugeRsvd
		case "Hugepagesize":
			dst, unit = &m.hugepageSize, 1024
		default:
			continue
		}
		f := strings.Fields(val)
		if len(f) == 0 || len(f) > 2 || (unit == 1024) != (len(f) == 2 && f[1] == "kB") {
			return m, fmt.Errorf("line %d: %s: want a count (or kB for Hugepagesize), got %q", n, key, strings.TrimSpace(val))
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || v < 0 || v > (1<<53)/unit {
			return m, fmt.Errorf("line %d: %s: %q is not a count", n, key, f[0])
		}
		*dst = v * unit
		seen[key] = true
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	for _, k := range []string{"HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "Hugepagesize"} {
		if !seen[k] {
			return m, fmt.Errorf("no %s line (a kernel without hugetlb support?)", k)
		}
	}
	return m, nil
}

// parseCount reads a file holding one non-negative integer, such as
// /proc/sys/vm/nr_hugepages.
func parseCount(b []byte) (int64, error) {
	s := strings.TrimSpace(string(b))
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		if len(s) > 32 {
			s = s[:32] + "..."
		}
		return 0, fmt.Errorf("want a non-negative count, got %q", s)
	}
	return v, nil
}

// parseCapEff reads the CapEff line of /proc/self/status: the effective
// capability set as a hex bit mask.
func parseCapEff(b []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan() && n <= maxMeminfoLines; n++ {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || key != "CapEff" {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(val), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("line %d: CapEff: %q is not a hex mask", n, strings.TrimSpace(val))
		}
		return v, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no CapEff line")
}

// socketPath returns the unix socket path of an API listen address:
// "unix:PATH", "unix://PATH" or an absolute path. ok is false for a TCP
// address (host:port) or an empty one.
func socketPath(listen string) (path string, ok bool) {
	switch {
	case strings.HasPrefix(listen, "unix://"):
		path = strings.TrimPrefix(listen, "unix://")
	case strings.HasPrefix(listen, "unix:"):
		path = strings.TrimPrefix(listen, "unix:")
	case strings.HasPrefix(listen, "/"):
		path = listen
	default:
		return "", false
	}
	return path, path != ""
}
