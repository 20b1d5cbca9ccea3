package host

import (
	"encoding/binary"
	"fmt"

	"github.com/kvtier/kvtier/host/control"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// Payload fills dst with the deterministic payload of page h, kind k: a
// splitmix64 stream seeded by the hash and the kind. Every tier's copy of
// the page must hold exactly these bytes.
func Payload(dst []byte, h pagehash.Hash, k tiers.PayloadKind) {
	s := binary.LittleEndian.Uint64(h[0:8]) ^ binary.LittleEndian.Uint64(h[8:16])*0x9e3779b97f4a7c15 ^
		binary.LittleEndian.Uint64(h[16:24])<<1 ^ binary.LittleEndian.Uint64(h[24:32])<<2 ^ uint64(k)<<56
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(dst[i:], z^z>>31)
	}
	for ; i < len(dst); i++ {
		dst[i] = byte(s >> (8 * (i % 8)))
	}
}

// PagePool is the part of a host L1 pool a simulated engine uses: direct
// page reads and writes (l1cuda.HostPool has them).
type PagePool interface {
	ReadPage(page int, kind tiers.PayloadKind, dst []byte) error
	WritePage(page int, kind tiers.PayloadKind, src []byte) error
}

// SimEngine is a simulated engine rank over a host L1 pool: it writes
// every placed page's payload (Payload of its hash) and verifies pages it
// reads byte for byte.
type SimEngine struct {
	pool  PagePool
	kinds []int64 // page bytes per kind
	want  []byte
	got   []byte

	// lanes and rank: with more than one lane the engine is one rank of a
	// context-parallel group and holds only the pages it owns (OwnLane).
	lanes, rank int

	// VerifiedPages counts pages read and compared (every kind); WrongBytes
	// the bytes that differed; WrongPages the pages with any difference.
	VerifiedPages, WrongBytes, WrongPages int64
}

// OwnLane makes the engine rank rank of lanes owner lanes, as a
// context-parallel rank is: Place writes the payload of the pages it owns
// (page i of a key: lane i mod lanes) and poison (the payload with every
// byte inverted) in the L1 pages of the others, since this rank never
// computes them; Verify checks only its own pages. A page that reached
// this rank's L1 by any other way than its owner's copies shows as wrong
// bytes on the rank that owns it.
func (e *SimEngine) OwnLane(rank, lanes int) error {
	if lanes < 1 || rank < 0 || rank >= lanes {
		return fmt.Errorf("host: simulated engine: rank %d of %d lanes", rank, lanes)
	}
	e.rank, e.lanes = rank, lanes
	return nil
}

func (e *SimEngine) owns(i int) bool { return control.OwnerOf(i, e.lanes) == e.rank }

// NewSimEngine returns an engine over pool with the given payload
// geometry.
func NewSimEngine(pool tiers.Pool, g tiers.PayloadGeometry) (*SimEngine, error) {
	pp, ok := pool.(PagePool)
	if !ok {
		return nil, fmt.Errorf("host: simulated engine: pool %T cannot read and write pages (want a host pool)", pool)
	}
	e := &SimEngine{pool: pp}
	var most int64
	for _, k := range g.Kinds {
		e.kinds = append(e.kinds, k.PageBytes)
		most = max(most, k.PageBytes)
	}
	e.want, e.got = make([]byte, most), make([]byte, most)
	return e, nil
}

// Place writes the payload of every placed page.
func (e *SimEngine) Place(p control.Placement, hashes []pagehash.Hash) error {
	i := 0
	for _, r := range p.L1 {
		for pg := r.Start; pg < r.Start+r.Pages; pg++ {
			if i >= len(hashes) {
				return fmt.Errorf("placement of node %d has more pages than the %d hashes of its insert", p.Node, len(hashes))
			}
			for k, pb := range e.kinds {
				b := e.want[:pb]
				Payload(b, hashes[i], tiers.PayloadKind(k))
				if !e.owns(p.Depth + i) {
					for j := range b {
						b[j] = ^b[j]
					}
				}
				if err := e.pool.WritePage(int(pg), tiers.PayloadKind(k), b); err != nil {
					return err
				}
			}
			i++
		}
	}
	return nil
}

// Verify reads each page from L1 and compares it with its payload; it
// returns how many leading pages were right (a wrong page ends the
// usable prefix: the engine would recompute from there).
func (e *SimEngine) Verify(pages []control.PageRef) (int, error) {
	good := -1
	for i, p := range pages {
		if !e.owns(i) {
			continue
		}
		bad := false
		for k, pb := range e.kinds {
			w, g := e.want[:pb], e.got[:pb]
			Payload(w, p.Hash, tiers.PayloadKind(k))
			if err := e.pool.ReadPage(int(p.L1), tiers.PayloadKind(k), g); err != nil {
				return i, err
			}
			if string(w) != string(g) {
				bad = true
				for j := range w {
					if w[j] != g[j] {
						e.WrongBytes++
					}
				}
			}
		}
		e.VerifiedPages++
		if bad {
			e.WrongPages++
			if good < 0 {
				good = i
			}
		}
	}
	if good < 0 {
		good = len(pages)
	}
	return good, nil
}
