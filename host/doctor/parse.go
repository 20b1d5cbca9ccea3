package doctor

import (
	"fmt"
	"strings"

	"github.com/prometheus/procfs"
)

// meminfo holds the hugepage figures of /proc/meminfo.
type meminfo struct {
	hugeTotal, hugeFree, hugeRsvd int64
	// hugepageSize is the default hugepage size in bytes.
	hugepageSize int64
}

// maxCount bounds the figures hugeMeminfo accepts: beyond 2^53 pages (or
// bytes) a figure is garbage, not a machine.
const maxCount = 1 << 53

// hugeMeminfo takes the HugePages_Total, HugePages_Free, HugePages_Rsvd
// and Hugepagesize figures out of /proc/meminfo as procfs read it.
func hugeMeminfo(mi procfs.Meminfo) (meminfo, error) {
	var m meminfo
	for _, f := range []struct {
		key string
		src *uint64
		dst *int64
	}{
		{"HugePages_Total", mi.HugePagesTotal, &m.hugeTotal},
		{"HugePages_Free", mi.HugePagesFree, &m.hugeFree},
		{"HugePages_Rsvd", mi.HugePagesRsvd, &m.hugeRsvd},
		{"Hugepagesize", mi.HugepagesizeBytes, &m.hugepageSize},
	} {
		if f.src == nil {
			return m, fmt.Errorf("no %s line (a kernel without hugetlb support?)", f.key)
		}
		if *f.src > maxCount {
			return m, fmt.Errorf("%s: %d is not a count", f.key, *f.src)
		}
		*f.dst = int64(*f.src)
	}
	return m, nil
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
