package l3disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// ErrNoPLP means require_plp is set and the disk's fdatasync latency says
// it is probably not power-loss protected.
var ErrNoPLP = errors.New("disk not power-loss protected")

// PLPResult is the outcome of the power-loss-protection probe.
type PLPResult struct {
	// Probes is the number of 4 KiB write+fdatasync rounds.
	Probes int
	// Median and Max are their latencies.
	Median, Max time.Duration
	// Direct reports whether the probe used O_DIRECT.
	Direct bool
	// Protected is Median <= the configured limit. A heuristic: a disk
	// with power-loss protection acknowledges a flush from its protected
	// cache in tens of microseconds; one without must reach the media.
	Protected bool
}

// ProbePLP times probes rounds of an aligned 4 KiB write followed by
// fdatasync on a scratch file in dir (removed afterwards) and compares the
// median with maxSync.
func ProbePLP(fs diskfs.FS, dir string, probes int, oDirect string, maxSync time.Duration) (PLPResult, error) {
	res := PLPResult{Probes: probes}
	if probes <= 0 {
		return res, fmt.Errorf("plp probe: %d probes", probes)
	}
	path := filepath.Join(dir, fmt.Sprintf(".kvtier-l3-plp-probe-%d-%d", os.Getpid(), time.Now().UnixNano()))
	f, err := fs.OpenFile(path, diskfs.OpenOptions{Create: true, Direct: oDirect != ODirectOff})
	if errors.Is(err, diskfs.ErrDirectRefused) && oDirect == ODirectAuto {
		f, err = fs.OpenFile(path, diskfs.OpenOptions{Create: true})
	}
	if err != nil {
		return res, fmt.Errorf("plp probe in %s: %w", dir, err)
	}
	res.Direct = f.Direct()
	buf, err := diskfs.NewAlignedBuffer(diskfs.BlockSize)
	if err != nil {
		return res, errors.Join(err, f.Close(), fs.Remove(path))
	}
	lat := make([]time.Duration, 0, probes)
	for i := range probes {
		buf.Bytes()[0] = byte(i)
		t0 := time.Now()
		if _, err = f.WriteAt(buf.Bytes(), int64(i%4)*diskfs.BlockSize); err == nil {
			err = f.Datasync()
		}
		if err != nil {
			err = fmt.Errorf("plp probe in %s: %w", dir, err)
			break
		}
		lat = append(lat, time.Since(t0))
	}
	err = errors.Join(err, buf.Free(), f.Close(), fs.Remove(path))
	if err != nil {
		return res, err
	}
	slices.Sort(lat)
	res.Median, res.Max = lat[len(lat)/2], lat[len(lat)-1]
	res.Protected = res.Median <= maxSync
	return res, nil
}
