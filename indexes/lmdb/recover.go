package lmdb

import (
	"strconv"
	"time"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	mdb "github.com/PowerDNS/lmdb-go/lmdb"
	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/indexes"
)

// dataFileName is LMDB's data file in an environment directory.
const dataFileName = "data.mdb"

// verifyWithRetry runs VerifyFile, trying again a few times: another rank
// committing while it reads can make a healthy file look torn.
func verifyWithRetry(path string) error {
	var err error
	for try := range 3 {
		if try > 0 {
			time.Sleep(time.Duration(try) * 20 * time.Millisecond)
		}
		if err = VerifyFile(path); err == nil || !errors.Is(err, indexes.ErrCorrupt) {
			return err
		}
	}
	return err
}

// isInvalidFile reports whether err is LMDB refusing the files as invalid
// or corrupt rather than an I/O or configuration problem.
func isInvalidFile(err error) bool {
	return isErrno(err, mdb.Invalid) || isErrno(err, mdb.VersionMismatch) || isErrno(err, mdb.Corrupted) || isErrno(err, mdb.PageNotFound)
}

// setAside moves a damaged data file out of the way (on_corrupt:
// set_aside) so a fresh environment can start, or refuses (on_corrupt:
// refuse, or when another process has the environment open: it may still
// be serving from the file).
func setAside(dir string, cfg Config, damage error, log *slog.Logger) error {
	if !errors.Is(damage, indexes.ErrCorrupt) {
		damage = fmt.Errorf("%w: %w", damage, indexes.ErrCorrupt)
	}
	if cfg.OnCorrupt == OnCorruptRefuse {
		return fmt.Errorf("open lmdb index %s: %w (on_corrupt: refuse; move data.mdb away or rebuild with kvtier inspect l3 --rebuild-index)", dir, damage)
	}
	if pids := otherOpeners(dir); pids != "" {
		return fmt.Errorf("open lmdb index %s: %w; not set aside because process %s has the environment open", dir, damage, pids)
	}
	data := filepath.Join(dir, dataFileName)
	aside := fmt.Sprintf("%s.corrupt-%s", data, time.Now().UTC().Format("20060102T150405.000000000"))
	if err := os.Rename(data, aside); err != nil {
		return fmt.Errorf("open lmdb index %s: %w; set aside: %w", dir, damage, err)
	}
	// NB: the lock file's reader table described the old file.
	if err := os.Remove(filepath.Join(dir, "lock.mdb")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open lmdb index %s: %w; remove lock.mdb: %w", dir, damage, err)
	}
	log.Error("lmdb index damaged; set aside and started empty (the store rebuilds its entries)",
		"dir", dir, "set_aside_as", aside, "reason", damage.Error())
	return nil
}

// otherOpeners returns the pid of a process holding a slot of dir's
// process-lock file, or "" if none.
func otherOpeners(dir string) string {
	f, err := os.OpenFile(filepath.Join(dir, procLockFileName), os.O_RDWR, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 0, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil || lk.Type == unix.F_UNLCK {
		return ""
	}
	return strconv.FormatInt(lk.Start, 10)
}

// OpenDamage implements indexes.Recoverer: why Open set the data file
// aside, or nil.
func (ix *Index) OpenDamage() error { return ix.openDamage }

// Reset implements indexes.Resetter: it empties the database in one write
// transaction (every rank's entries).
func (ix *Index) Reset(ctx context.Context) (err error) {
	release, err := ix.enter(ctx, "reset")
	if err != nil {
		return err
	}
	defer release()
	return ix.update("reset", 0, func(txn *mdb.Txn) error {
		return txn.Drop(ix.dbi, false)
	})
}
