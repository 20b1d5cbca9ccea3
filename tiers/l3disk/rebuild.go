package l3disk

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// slotVerdict is what a full read of one slot found.
type slotVerdict uint8

const (
	verdictEmpty      slotVerdict = iota // all-zero header: never written
	verdictValid                         // current epoch, payload CRC matches
	verdictBadPayload                    // current-epoch header, payload CRC fails
	verdictBadHeader                     // written-looking, undecodable header
	verdictStale                         // valid header of another epoch or kind
	verdictUnreadable                    // the read failed
)

// fileScan is a full, verified read of every slot of one slab file.
type fileScan struct {
	headers []SlotHeader
	verdict []slotVerdict
	// bytes is how many bytes were read.
	bytes int64
}

func (sc *fileScan) count(v slotVerdict) int {
	n := 0
	for _, x := range sc.verdict {
		if x == v {
			n++
		}
	}
	return n
}

// scanChunk is the sequential read unit of a verified scan: large enough
// that the device streams, small enough that depth of them stay cheap.
const scanChunk = 8 << 20

// verifyFile reads every slot of f in large sequential chunks, depth chunks
// in flight, and verifies each slot's header and payload CRC against the
// file's kind, epoch and page size. A chunk that fails to read is read
// again slot by slot, so one bad sector costs one slot.
func verifyFile(ctx context.Context, f *slabFile, depth int) (fileScan, error) {
	n := f.sb.Slots
	sc := fileScan{headers: make([]SlotHeader, n), verdict: make([]slotVerdict, n)}
	perChunk := max(1, scanChunk/f.sb.SlotBytes)
	depth = max(depth, 1)
	var (
		next  int64
		mu    sync.Mutex
		wg    sync.WaitGroup
		errs  = make([]error, depth)
		bytes = make([]int64, depth)
	)
	for w := range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, err := diskfs.NewAlignedBuffer(int(perChunk * f.sb.SlotBytes))
			if err != nil {
				errs[w] = err
				return
			}
			defer func() { _ = buf.Free() }()
			for {
				mu.Lock()
				first := next
				next += perChunk
				mu.Unlock()
				if first >= n {
					return
				}
				if err := ctx.Err(); err != nil {
					errs[w] = fmt.Errorf("scan %s: %w", f.path, err)
					return
				}
				cnt := min(perChunk, n-first)
				b := buf.Bytes()[:cnt*f.sb.SlotBytes]
				if _, err := f.f.ReadAt(b, f.offset(first)); err != nil {
					for i := range cnt {
						sb := b[i*f.sb.SlotBytes : (i+1)*f.sb.SlotBytes]
						if err := f.readSlot(first+i, sb); err != nil {
							sc.verdict[first+i] = verdictUnreadable
							continue
						}
						bytes[w] += f.sb.SlotBytes
						sc.judge(f, first+i, sb)
					}
					continue
				}
				bytes[w] += int64(len(b))
				for i := range cnt {
					sc.judge(f, first+i, b[i*f.sb.SlotBytes:(i+1)*f.sb.SlotBytes])
				}
			}
		}()
	}
	wg.Wait()
	for _, b := range bytes {
		sc.bytes += b
	}
	return sc, errors.Join(errs...)
}

// judge records the verdict of one slot read whole into b.
func (sc *fileScan) judge(f *slabFile, slot int64, b []byte) {
	h, err := DecodeSlotHeader(b)
	switch {
	case err != nil && allZero(b[:HeaderSize]):
		sc.verdict[slot] = verdictEmpty
		return
	case err != nil:
		sc.verdict[slot] = verdictBadHeader
		return
	case h.Kind != f.sb.Kind || h.Epoch != f.epoch() || int64(h.PayloadLen) != f.sb.PageBytes:
		sc.verdict[slot] = verdictStale
		return
	}
	sc.headers[slot] = h
	if PayloadCRC(b[HeaderSize:HeaderSize+f.sb.PageBytes]) != h.PayloadCRC {
		sc.verdict[slot] = verdictBadPayload
		return
	}
	sc.verdict[slot] = verdictValid
}

// RebuildCounts is what rebuilding an index from the slot headers did.
type RebuildCounts struct {
	// Kept is the number of pages indexed: slots of the current epoch
	// whose header and payload verified (one per page hash).
	Kept int64
	// Corrupt slots had a current header but a payload failing its CRC,
	// or an undecodable header; Duplicates held a page another slot
	// already holds; Unreadable slots failed to read.
	Corrupt, Duplicates, Unreadable int64
	// Bytes is how much slab was read, Elapsed how long the rebuild took.
	Bytes   int64
	Elapsed time.Duration
}

// rebuildFile indexes every verified slot of f (kind k of this store's
// disk) in batches and returns the live slots, one per page hash.
func rebuildFile(ctx context.Context, ix indexes.Index, f *slabFile, disk int, depth int, rc *RebuildCounts) ([]liveSlot, error) {
	sc, err := verifyFile(ctx, f, depth)
	if err != nil {
		return nil, err
	}
	return indexVerified(ctx, ix, f, disk, &sc, rc)
}

// indexVerified puts an entry for every verified slot of a scan of f (the
// first slot of each page hash) and returns them as live slots.
func indexVerified(ctx context.Context, ix indexes.Index, f *slabFile, disk int, sc *fileScan, rc *RebuildCounts) ([]liveSlot, error) {
	rc.Bytes += sc.bytes
	seen := make(map[pagehash.Hash]bool)
	var live []liveSlot
	batch := make([]indexes.Entry, 0, 1024)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := ix.Put(ctx, batch); err != nil {
			return fmt.Errorf("rebuild index from %s: put %d entries: %w", f.path, len(batch), err)
		}
		batch = batch[:0]
		return nil
	}
	for slot, v := range sc.verdict {
		switch v {
		case verdictBadPayload, verdictBadHeader:
			rc.Corrupt++
			continue
		case verdictUnreadable:
			rc.Unreadable++
			continue
		case verdictValid:
		default:
			continue
		}
		h := sc.headers[slot]
		if seen[h.Hash] {
			rc.Duplicates++
			continue
		}
		seen[h.Hash] = true
		rc.Kept++
		live = append(live, liveSlot{kind: f.sb.Kind, slot: int32(slot), hash: h.Hash, verified: true})
		batch = append(batch, indexes.Entry{
			Key:    indexes.Key{Hash: h.Hash, Kind: f.sb.Kind},
			Record: indexes.Record{Disk: uint16(disk), Kind: f.sb.Kind, Slot: uint64(slot), Epoch: f.epoch()},
		})
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return live, nil
}
