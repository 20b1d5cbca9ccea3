package serve

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/workload"
)

// DefaultRecordMaxBytes is the default size at which a recording rotates
// to its next file (Config.RecordMaxBytes).
const DefaultRecordMaxBytes = 256 << 20

// DefaultRecordKeep is the default number of recording files kept
// (Config.RecordKeep): the oldest beyond it are removed.
const DefaultRecordKeep = 8

// recordQueue bounds the lookups waiting for the recorder's writer; a
// step never waits for it (past it, lookups are dropped and counted).
const recordQueue = 4096

// recorder writes rank 0's accepted lookups as a Mooncake-format JSONL
// trace (docs/serve.md, "Recording"): one line a lookup, the timestamp in
// milliseconds since the recording began, input_length = pages x 512 (a
// recorded block is one serve page), and hash_ids remapped to small
// integers (0, 1, 2, ... in order of first appearance) per file, so
// neither tokens nor page hashes leave the node. A file past maxBytes is
// closed and the next one opened (path, path.1, path.2, ...; each file
// remaps afresh, so each replays alone), keeping the newest keep.
type recorder struct {
	path     string
	maxBytes int64
	keep     int
	log      *slog.Logger
	start    time.Time

	q    *offPath[recorded]
	done chan struct{}

	// writer goroutine's state
	part    int
	f       *os.File
	w       *bufio.Writer
	written int64
	ids     map[pagehash.Hash]uint64
	lines   uint64
	err     error
}

type recorded struct {
	at     time.Time
	hashes []pagehash.Hash
}

// openRecorder creates path (and its directory's next parts later);
// keep < 1 and maxBytes < 1 take the defaults.
func openRecorder(path string, maxBytes int64, keep int, log *slog.Logger) (*recorder, error) {
	if maxBytes < 1 {
		maxBytes = DefaultRecordMaxBytes
	}
	if keep < 1 {
		keep = DefaultRecordKeep
	}
	r := &recorder{path: path, maxBytes: maxBytes, keep: keep, log: log, start: time.Now(),
		q: newOffPath[recorded](recordQueue), done: make(chan struct{})}
	if err := r.openPart(); err != nil {
		return nil, err
	}
	go r.run()
	return r, nil
}

// partPath names part n: path, then path.1, path.2, ...
func (r *recorder) partPath(n int) string {
	if n == 0 {
		return r.path
	}
	return r.path + "." + strconv.Itoa(n)
}

func (r *recorder) openPart() error {
	f, err := os.OpenFile(r.partPath(r.part), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	r.f, r.w, r.written = f, bufio.NewWriterSize(f, 1<<16), 0
	r.ids = map[pagehash.Hash]uint64{}
	if old := r.part - r.keep; old >= 0 {
		if err := os.Remove(r.partPath(old)); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("kvtier serve: record: removing an old part", "file", r.partPath(old), "err", err)
		}
	}
	return nil
}

// Record queues one lookup's page keys; it never blocks (a full queue
// drops the lookup and counts it).
func (r *recorder) Record(at time.Time, key []pagehash.Hash) {
	if r == nil || len(key) == 0 {
		return
	}
	r.q.Send(recorded{at: at, hashes: append([]pagehash.Hash(nil), key...)})
}

func (r *recorder) run() {
	defer close(r.done)
	for rec := range r.q.Recv() {
		if r.err != nil {
			continue // failed: drain, said at Close
		}
		r.err = r.write(rec)
		if r.err != nil {
			r.log.Error("kvtier serve: record: writing stopped", "file", r.partPath(r.part), "err", r.err)
		}
	}
	if r.f != nil {
		if err := r.w.Flush(); err != nil && r.err == nil {
			r.err = err
		}
		if err := r.f.Close(); err != nil && r.err == nil {
			r.err = err
		}
	}
}

func (r *recorder) write(rec recorded) error {
	b, err := r.line(rec)
	if err != nil {
		return err
	}
	if r.written > 0 && r.written+int64(len(b)) > r.maxBytes {
		if err := r.w.Flush(); err != nil {
			return err
		}
		if err := r.f.Close(); err != nil {
			return err
		}
		r.f = nil
		r.part++
		if err := r.openPart(); err != nil {
			return err
		}
		// The new file remaps from 0.
		if b, err = r.line(rec); err != nil {
			return err
		}
	}
	n, err := r.w.Write(b)
	r.written += int64(n)
	r.lines++
	return err
}

// line encodes rec under the current file's id map.
func (r *recorder) line(rec recorded) ([]byte, error) {
	ids := make([]uint64, len(rec.hashes))
	for i, h := range rec.hashes {
		id, ok := r.ids[h]
		if !ok {
			id = uint64(len(r.ids))
			r.ids[h] = id
		}
		ids[i] = id
	}
	b, err := json.Marshal(workload.Request{Timestamp: rec.at.Sub(r.start).Milliseconds(), InputLength: len(ids) * workload.BlockTokens, HashIDs: ids})
	return append(b, '\n'), err
}

// Close stops recording: the queued lookups are written and the file
// closed. It reports a write error and says how many lookups were dropped.
func (r *recorder) Close() error {
	if r == nil {
		return nil
	}
	r.q.Close()
	<-r.done
	if d := r.q.Dropped(); d > 0 {
		r.log.Warn("kvtier serve: record: lookups dropped (the writer fell behind)", "dropped", d, "written", r.lines)
	}
	if r.err != nil {
		return fmt.Errorf("record %s: %w", r.partPath(r.part), r.err)
	}
	return nil
}
