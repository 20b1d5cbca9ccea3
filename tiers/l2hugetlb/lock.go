// The lock protocol. Rank 0 (the creator) holds its stack's lock file
// exclusively while it creates the slab files, then downgrades to shared.
// Joining ranks and attaching processes share-lock it only when someone
// holds it (the creator is alive) and nobody holds it exclusively (the
// creator is done). A lock file nobody holds marks files left by a host
// that is gone: stale. Flocks die with their process, so a crash never
// leaves a lock held.

package l2hugetlb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Timing of the lock protocol. A creator retries its exclusive lock for
// lockRetry (another rank may be probing it for a moment); a joining rank
// waits up to joinWait for the creator to finish.
const (
	lockRetry = 250 * time.Millisecond
	joinWait  = 60 * time.Second
	pollEvery = 20 * time.Millisecond
)

// flockRetry takes how on f, retrying a refused non-blocking attempt until
// wait has passed or ctx is done.
func flockRetry(ctx context.Context, f *os.File, how int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// lockState is what joinLock found.
type lockState int

const (
	lockAbsent   lockState = iota // no lock file
	lockDead                      // nobody holds it: the creator is gone or not there yet
	lockCreating                  // held exclusively: the creator is creating
	lockJoined                    // share-locked by us; the creator is alive and done
)

// joinLock opens and share-locks a stack lock whose creator is alive and
// done: someone holds it (the creator), and nobody holds it exclusively
// (the creator finished creating). The file is returned only for
// lockJoined.
func joinLock(path string) (*os.File, lockState, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, lockAbsent, nil
	}
	if err != nil {
		return nil, lockAbsent, fmt.Errorf("open slab lock: %w", err)
	}
	// Probe on a second open file description: if we can lock it
	// exclusively nobody holds it, so its creator is gone (stale) or not
	// there yet.
	probe, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		f.Close()
		return nil, lockAbsent, fmt.Errorf("open slab lock: %w", err)
	}
	free := unix.Flock(int(probe.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil
	probe.Close()
	if free {
		f.Close()
		return nil, lockDead, nil
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, lockCreating, nil
		}
		return nil, lockAbsent, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, lockJoined, nil
}
