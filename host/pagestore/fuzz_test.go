package pagestore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/crc32c"
)

// FuzzDoor drives an in-process door (real slab, memstore below) with
// random batches of gets, sets, commits, releases, clears, closes, lease
// expiries and scribbled slab bytes. It must never panic, every hit must
// carry the key's bytes, and the slot and pin accounting must hold after
// every call (Door.check: no slot held twice, pins equal the leases').
func FuzzDoor(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{1, 0x0f, 0x33, 2, 0, 0xff, 3, 0x0f, 1, 0, 5, 0x0f, 3, 0})
	f.Add(bytes.Repeat([]byte{1, 0xff, 0x12, 2, 0, 0xaa, 3, 0xff, 4, 0}, 8))
	f.Add(bytes.Repeat([]byte{1, 0x3c, 0x77, 9, 3, 0xc3, 2, 1, 0x55, 8, 6, 7}, 6))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		h := newHarness(t, 6, false, nil, Limits{MaxBatchPages: 8, MaxKeyBytes: 8})
		ctx := context.Background()
		sessions := []string{h.register(t), h.register(t)}
		type setLease struct {
			ses  string
			id   uint64
			keys []string
			res  []*pb.SetPage
		}
		var sets []setLease
		type getLease struct {
			ses string
			id  uint64
		}
		var gets []getLease
		pos := 0
		next := func() byte {
			if pos >= len(data) {
				return 0
			}
			pos++
			return data[pos-1]
		}
		keysOf := func(mask byte, salt byte) []string {
			var ks []string
			for i := range 8 {
				if mask&(1<<i) != 0 {
					ks = append(ks, fmt.Sprintf("k%d", (i+int(salt))%12))
				}
			}
			if salt%7 == 3 {
				ks = append(ks, "") // invalid
			}
			return ks
		}
		for pos < len(data) {
			op := next() % 10
			ses := sessions[int(next())%len(sessions)]
			switch op {
			case 0: // register another
				if len(sessions) < 4 {
					sessions = append(sessions, h.register(t))
				}
			case 1: // set
				ks := keysOf(next(), next())
				r, err := h.d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: ks})
				if err != nil {
					continue
				}
				for i, p := range r.GetPages() {
					for k, s := range p.GetSpans() {
						copy(h.bytesOf(t, s), page(ks[i], k, int64(s.GetLength())))
					}
				}
				if r.GetLease() != 0 {
					sets = append(sets, setLease{ses, r.GetLease(), ks, r.GetPages()})
				}
			case 2: // commit
				if len(sets) == 0 {
					continue
				}
				i := int(next()) % len(sets)
				l := sets[i]
				sets = append(sets[:i], sets[i+1:]...)
				mask := next()
				w := make([]bool, len(l.keys))
				for j := range w {
					w[j] = mask&(1<<(j%8)) != 0
				}
				// sel: 1 hands the client's sums, 2 with one of them
				// wrong (a page under a wrong sum is never a hit), 3 with
				// the wrong count (refused).
				var sums []uint32
				switch sel := next() % 4; sel {
				case 1, 2:
					nk := len(testKinds)
					sums = make([]uint32, len(l.keys)*nk)
					for j, p := range l.res {
						for k, sp := range p.GetSpans() {
							sums[j*nk+k] = crc32c.Checksum(page(l.keys[j], k, int64(sp.GetLength())))
						}
					}
					if sel == 2 && len(sums) > 0 {
						sums[int(next())%len(sums)] ^= 0x10
					}
				case 3:
					sums = make([]uint32, 1)
				}
				_, _ = h.d.Commit(ctx, &pb.CommitRequest{Session: l.ses, Lease: l.id, Written: w, Sums: sums})
			case 3: // get (selector 1: checked at release, 2: checked by the client; both released at once)
				ks := keysOf(next(), next())
				mode := next() % 3
				atRelease, verifies := mode == 1, mode == 2
				r, err := h.d.BatchGet(ctx, &pb.GetRequest{Session: ses, Keys: ks, DeadlineMs: 2000, CheckAtRelease: atRelease, ClientVerifies: verifies})
				if err != nil {
					continue
				}
				var wrong []uint32
				for i, p := range r.GetPages() {
					if p.GetStatus() != pb.GetStatus_GET_STATUS_HIT {
						continue
					}
					if verifies && len(p.GetSums()) != len(p.GetSpans()) {
						t.Fatalf("key %q: %d sums for %d spans", ks[i], len(p.GetSums()), len(p.GetSpans()))
					}
					bad := false
					for k, s := range p.GetSpans() {
						b := h.bytesOf(t, s)
						if verifies && crc32c.Checksum(b) != p.GetSums()[k] {
							bad = true // the client's check: a miss, reported
							continue
						}
						if !bytes.Equal(b, page(ks[i], k, int64(s.GetLength()))) {
							if !atRelease {
								t.Fatalf("key %q kind %d: wrong bytes on a hit", ks[i], k)
							}
							wrong = append(wrong, uint32(i))
						}
					}
					if bad {
						wrong = append(wrong, uint32(i))
					}
				}
				if verifies {
					if r.GetLease() != 0 {
						_, _ = h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: r.GetLease(), Corrupt: wrong})
					}
					continue
				}
				if atRelease {
					if r.GetLease() == 0 {
						if len(wrong) > 0 {
							t.Fatalf("wrong bytes on hits %v of a get without a lease", wrong)
						}
						continue
					}
					rel, err := h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: r.GetLease()})
					if err != nil {
						continue // unconfirmed: the client uses none of the hits
					}
					for _, i := range wrong {
						if !slices.Contains(rel.GetCorrupt(), i) {
							t.Fatalf("key %q: wrong bytes on a hit that its release confirmed (corrupt %v)", ks[i], rel.GetCorrupt())
						}
					}
					continue
				}
				if r.GetLease() != 0 {
					gets = append(gets, getLease{ses, r.GetLease()})
				}
			case 4: // release
				if len(gets) == 0 {
					continue
				}
				i := int(next()) % len(gets)
				_, _ = h.d.Release(ctx, &pb.ReleaseRequest{Session: gets[i].ses, Lease: gets[i].id})
				gets = append(gets[:i], gets[i+1:]...)
			case 5: // exists
				_, _ = h.d.BatchExists(ctx, &pb.ExistsRequest{Session: ses, Keys: keysOf(next(), next())})
			case 6: // close
				_, _ = h.d.Close(ctx, &pb.CloseRequest{Session: ses})
			case 7: // clear
				_, _ = h.d.Clear(ctx, &pb.ClearRequest{Session: ses})
			case 8: // every lease expires
				h.d.sweep(time.Now().Add(h.d.opt.Limits.Lease + time.Second))
			case 9: // scribble on a committed page
				h.d.mu.Lock()
				var victim *entry
				for _, e := range h.d.entries {
					if e.state == stCommitted && (victim == nil || bytes.Compare(e.hash[:], victim.hash[:]) < 0) {
						victim = e
					}
				}
				if victim != nil {
					h.d.view(victim.slot, int(next())%len(testKinds))[int(next())] ^= 0x5a
				}
				h.d.mu.Unlock()
			}
			waitEvictable(t, h.d)
			if err := h.d.check(); err != nil {
				t.Fatalf("after op %d at byte %d: %v", op, pos, err)
			}
		}
	})
}

// FuzzRegister feeds Register arbitrary namespaces: it must never panic,
// a refusal names the namespace field (or protocol_versions), and an
// accepted namespace gets the same id every time.
func FuzzRegister(f *testing.F) {
	f.Add("m", "", "page_first", "bfloat16", "", uint32(16), "k", uint64(8192), "v", uint64(8192), uint32(0), uint32(1), true, uint32(1))
	f.Add("", "r", "", "", "salt", uint32(0), "kv", uint64(1), "", uint64(0), uint32(3), uint32(2), false, uint32(2))
	f.Add("m", "", "", "", "", uint32(1), "k", uint64(8192), "v", uint64(4096), uint32(7), uint32(8), false, uint32(1))
	f.Fuzz(func(t *testing.T, model, rev, layout, dtype, salt string, tokens uint32, k0 string, b0 uint64, k1 string, b1 uint64, tpRank, tpSize uint32, mla bool, version uint32) {
		h := newHarness(t, 4, true, nil, Limits{})
		ns := &pb.Namespace{Model: model, ModelRevision: rev, KvLayout: layout, Dtype: dtype, Salt: salt, PageTokens: tokens,
			TpRank: tpRank, TpSize: tpSize, SharedAcrossTp: mla}
		if k0 != "" || b0 != 0 {
			ns.Kinds = append(ns.Kinds, &pb.PayloadKind{Name: k0, PageBytes: b0})
		}
		if k1 != "" || b1 != 0 {
			ns.Kinds = append(ns.Kinds, &pb.PayloadKind{Name: k1, PageBytes: b1})
		}
		r, err := h.d.Register(context.Background(), &pb.RegisterRequest{Namespace: ns, ProtocolVersions: []uint32{version}})
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, "namespace") && !strings.Contains(msg, "protocol_versions") {
				t.Fatalf("refusal names no field: %v", err)
			}
			return
		}
		id := namespaceID(ns)
		if !bytes.Equal(r.GetNamespaceId(), id[:]) {
			t.Fatalf("namespace id %x, recomputed %x", r.GetNamespaceId(), id)
		}
	})
}
