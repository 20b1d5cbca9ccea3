package l3disk

import (
	"context"
	"fmt"
	"runtime"

	"github.com/kvtier/kvtier/internal/bgprio"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/tiers"
	"github.com/kvtier/kvtier/tiers/l3disk/diskfs"
)

// Put implements tiers.Store.
func (s *Store) Put(_ context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.leave()
	items := make([]putItem, len(batch))
	for i, r := range batch {
		src, err := s.spanBytes(r.Key, r.Src)
		if err != nil {
			return 0, fmt.Errorf("l3disk put item %d: %w", i, err)
		}
		items[i] = putItem{index: i, key: r.Key, src: src, sum: r.Sum, hasSum: r.HasSum}
	}
	id := tiers.BatchID(s.nextBatch.Add(1))
	for i := range items {
		items[i].batch = id
	}
	s.gatherMu.Lock()
	s.gatherQ = append(s.gatherQ, items...)
	s.gatherMu.Unlock()
	signal(s.gatherSig)
	return id, nil
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (s *Store) ack(a ...tiers.Ack) { s.acks.Push(s.ackReady, a...) }

func (s *Store) failItems(items []putItem, err error) {
	acks := make([]tiers.Ack, len(items))
	for i, it := range items {
		acks[i] = tiers.Ack{Batch: it.batch, Index: it.index, Stage: tiers.AckFailed, Err: err}
	}
	s.st.putFailures.Add(int64(len(items)))
	s.ack(acks...)
}

// KeepsPutSums implements tiers.SumKeeper: a put with a sum writes it into
// the slot header as given.
func (s *Store) KeepsPutSums() bool { return true }

// DrainAcks implements tiers.Store.
func (s *Store) DrainAcks(dst []tiers.Ack) []tiers.Ack {
	return s.acks.Drain(dst)
}

// AckReady implements tiers.Store.
func (s *Store) AckReady() <-chan struct{} { return s.ackReady }

// gatherLoop copies put sources into staging buffers. Several run; each
// takes the oldest queued item.
func (s *Store) gatherLoop() {
	defer s.gatherWG.Done()
	defer bgprio.Lower()()
	for {
		s.gatherMu.Lock()
		var it putItem
		have := len(s.gatherQ) > 0
		more := false
		if have {
			it = s.gatherQ[0]
			s.gatherQ[0] = putItem{}
			s.gatherQ = s.gatherQ[1:]
			more = len(s.gatherQ) > 0
		}
		s.gatherMu.Unlock()
		if more {
			// Wake another gatherer for the rest: one signal per Put would
			// otherwise leave all but one of them asleep.
			signal(s.gatherSig)
		}
		if !have {
			select {
			case <-s.gatherSig:
				continue
			case <-s.stop:
				s.failQueued()
				return
			}
		}
		var buf *diskfs.AlignedBuffer
		select {
		case buf = <-s.staging:
		case <-s.stop:
			s.failItems([]putItem{it}, fmt.Errorf("l3disk put %s: %w", it.key, tiers.ErrClosed))
			s.failQueued()
			return
		}
		f := s.files[it.key.Kind]
		pb := s.pageBytes[it.key.Kind]
		po := f.payloadOff()
		b := buf.Bytes()
		crc := it.sum
		// NB: a payload of whole blocks in a block-aligned span is
		// written straight from the span (writeSlotv): no copy, and with
		// the producer's sum no pass over the bytes at all. The span is
		// then read until the write returns, so its AckGathered waits
		// for that (ioLoop).
		direct := s.zeroCopy && f.blockPayload() && diskfs.Aligned(it.src)
		switch {
		case direct:
			if !it.hasSum {
				crc = crc32c.Checksum(it.src)
			}
			clear(b[HeaderSize:diskfs.BlockSize])
		case it.hasSum:
			// Streaming stores: the staging buffer is read next by the
			// disk's DMA, not by a core, so its lines need not pass
			// through (and evict) the cache.
			memcopy.Copy(b[po:po+pb], it.src)
		default:
			// One pass: the copy and the checksum of what it copied.
			crc = crc32c.CopyUpdate(0, b[po:po+pb], it.src)
		}
		if !direct {
			clear(b[HeaderSize:po])
			clear(b[po+pb : f.sb.SlotBytes])
		}
		// NB: the producer's sum is written as given, never recomputed over
		// what was copied: bytes that changed in the slab after it was
		// taken fail every read's verification (a miss), instead of being
		// stored under a valid checksum of our own.
		SlotHeader{
			Version: f.version(), Kind: uint8(it.key.Kind), Epoch: f.epoch(), Hash: it.key.Hash,
			PayloadLen: uint32(pb), PayloadCRC: crc,
		}.Encode(b)
		if !direct {
			s.ack(tiers.Ack{Batch: it.batch, Index: it.index, Stage: tiers.AckGathered})
		}
		// NB: a page is up to MiBs of copy and CRC; a gatherer with more
		// queued would keep its P until preempted (10 ms), and the
		// caller's goroutines (a serve step) would wait that long for
		// one. Yield after each page.
		runtime.Gosched()
		job := &writeJob{key: it.key, items: []putItem{it}, buf: buf, slot: noSlot, direct: direct, own: it}
		select {
		case s.gathered <- job:
		case <-s.stop:
			s.staging <- buf
			s.failItems(job.items, fmt.Errorf("l3disk put %s: %w", it.key, tiers.ErrClosed))
			s.failQueued()
			return
		}
	}
}

func (s *Store) failQueued() {
	s.gatherMu.Lock()
	q := s.gatherQ
	s.gatherQ = nil
	s.gatherMu.Unlock()
	if len(q) > 0 {
		s.failItems(q, fmt.Errorf("l3disk put: %w", tiers.ErrClosed))
	}
}
