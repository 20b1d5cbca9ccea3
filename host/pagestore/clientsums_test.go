package pagestore

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// setSums stores keys as h.set does, handing Commit the client's sums:
// the CRC32C of what it wrote, except that wrong[key] flips one bit of
// that key's first sum (a client whose sum does not match its bytes).
func (h *harness) setSums(t *testing.T, ses string, wrong map[string]bool, keys ...string) {
	t.Helper()
	ctx := context.Background()
	r, err := h.d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	nk := len(testKinds)
	written := make([]bool, len(keys))
	sums := make([]uint32, len(keys)*nk)
	for i, p := range r.GetPages() {
		if p.GetStatus() != pb.SetStatus_SET_STATUS_RESERVED {
			continue
		}
		for k, s := range p.GetSpans() {
			b := page(keys[i], k, int64(s.GetLength()))
			sums[i*nk+k] = crc32c.CopyUpdate(0, h.bytesOf(t, s), b)
		}
		if wrong[keys[i]] {
			sums[i*nk] ^= 1
		}
		written[i] = true
	}
	if _, err := h.d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: written, Sums: sums}); err != nil {
		t.Fatal(err)
	}
	h.d.mu.Lock()
	h.d.waitCommits()
	h.d.mu.Unlock()
}

// waitGone waits (at most 5 s) until the store lacks key's page (of
// some kind): whatever deletes it has run.
func (h *harness) waitGone(t *testing.T, ses, key string) {
	t.Helper()
	h.d.mu.Lock()
	s := h.d.sessions[ses]
	h.d.mu.Unlock()
	hs, ok := make([]pagehash.Hash, 1), make([]bool, 1)
	h.d.hashKeys(s, []string{key}, hs, ok)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		n := 1
		for k := range testKinds {
			c, err := h.ms.LongestPrefix(context.Background(), tiers.PayloadKind(k), hs)
			if err != nil {
				t.Fatal(err)
			}
			n = min(n, c)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s still in the store after 5 s", key)
		}
	}
}

// getVerify is a client_verifies BatchGet: it checks each hit's copy
// against GetPage.sums, reports the failures at Release, and returns
// which keys were verified hits.
func (h *harness) getVerify(t *testing.T, ses string, keys ...string) []bool {
	t.Helper()
	ctx := context.Background()
	r, err := h.d.BatchGet(ctx, &pb.GetRequest{Session: ses, Keys: keys, ClientVerifies: true, DeadlineMs: 5000})
	if err != nil {
		t.Fatal(err)
	}
	ok := make([]bool, len(keys))
	var corrupt []uint32
	for i, p := range r.GetPages() {
		if p.GetStatus() != pb.GetStatus_GET_STATUS_HIT {
			continue
		}
		if len(p.GetSums()) != len(testKinds) {
			t.Fatalf("key %s: %d sums for %d kinds", keys[i], len(p.GetSums()), len(testKinds))
		}
		good := true
		for k, s := range p.GetSpans() {
			dst := make([]byte, s.GetLength())
			if crc32c.CopyUpdate(0, dst, h.bytesOf(t, s)) != p.GetSums()[k] {
				good = false
				continue
			}
			if !bytes.Equal(dst, page(keys[i], k, int64(s.GetLength()))) {
				t.Fatalf("key %s kind %d: wrong bytes under a matching sum", keys[i], k)
			}
		}
		if good {
			ok[i] = true
		} else {
			corrupt = append(corrupt, uint32(i))
		}
	}
	if r.GetLease() != 0 {
		if _, err := h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: r.GetLease(), Corrupt: corrupt}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.d.check(); err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestClientSums: pages committed with the client's sums and read by a
// client that verifies its copies. The door takes the client's sums as
// they are (a wrong one makes its page a miss for every reader, the
// door's own check included), hands them to verifying readers, drops the
// pages a reader reports, and reads no hit's bytes for such a reader (a
// page scribbled in the slab goes out as a hit whose copy fails).
func TestClientSums(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *harness, ses string)
	}{
		{"the client's sums round-trip", func(t *testing.T, h *harness, ses string) {
			h.setSums(t, ses, nil, "a", "b", "c")
			if got := h.getVerify(t, ses, "a", "b", "c", "absent"); !equalBools(got, []bool{true, true, true, false}) {
				t.Fatalf("verified hits %v", got)
			}
			// A reader that lets the door check gets the same pages.
			if got := h.get(t, ses, 0, "a", "b", "c"); !allStatus(got, pb.GetStatus_GET_STATUS_HIT) {
				t.Fatalf("door-checked get %v", got)
			}
		}},
		{"a wrong client sum is a miss for every reader", func(t *testing.T, h *harness, ses string) {
			h.setSums(t, ses, map[string]bool{"b": true}, "a", "b")
			// The door's check of the write-through's gather or of this
			// get drops b: a miss or CORRUPT, never a hit.
			if got := h.get(t, ses, 0, "a", "b"); got[0] != pb.GetStatus_GET_STATUS_HIT || got[1] == pb.GetStatus_GET_STATUS_HIT {
				t.Fatalf("door-checked get %v: the door did not take the client's sum as given", got)
			}
			h.setSums(t, ses, map[string]bool{"c": true}, "c")
			if got := h.getVerify(t, ses, "c"); got[0] {
				t.Fatal("a page under a wrong sum verified")
			}
			// Reported at Release: dropped, so a new set stores it again.
			// NB: memstore keeps no sums, so the door checks the slab at
			// AckGathered and deletes c from the store too; that runs
			// after the write-through, which may land after the report.
			// Wait for both, or the set may still find the store's copy
			// (EXISTS).
			waitEvictable(t, h.d)
			h.waitGone(t, ses, "c")
			if got := h.set(t, ses, "c"); got[0] != pb.SetStatus_SET_STATUS_RESERVED {
				t.Fatalf("set after the drop: %v", got)
			}
			if got := h.getVerify(t, ses, "c"); !got[0] {
				t.Fatal("the page stored again (door's sums) did not verify")
			}
		}},
		{"the door reads no hit for a verifying client", func(t *testing.T, h *harness, ses string) {
			h.setSums(t, ses, nil, "a", "b")
			// NB: the write-through gathers the bytes before the scribble
			// below (this test is about the store's good copy); gathered
			// after it, the door's check of the gather (memstore keeps no
			// sums) would count the page too and delete the store's copy.
			waitEvictable(t, h.d)
			r, err := h.d.BatchGet(context.Background(), &pb.GetRequest{Session: ses, Keys: []string{"b"}})
			if err != nil {
				t.Fatal(err)
			}
			h.bytesOf(t, r.GetPages()[0].GetSpans()[1])[7] ^= 0x40 // scribble b's v while pinned
			if _, err := h.d.Release(context.Background(), &pb.ReleaseRequest{Session: ses, Lease: r.GetLease()}); err != nil {
				t.Fatal(err)
			}
			corrupt := func() uint64 {
				h.d.mu.Lock()
				defer h.d.mu.Unlock()
				return h.d.st.corrupt
			}
			before := corrupt()
			if got := h.getVerify(t, ses, "a", "b"); !equalBools(got, []bool{true, false}) {
				t.Fatalf("verified hits %v, want a only", got)
			}
			if after := corrupt(); after != before+1 {
				t.Fatalf("corrupt count %d -> %d, want one reported page", before, after)
			}
			// Dropped from the slab: the next get reloads the store's
			// copy (written through before the scribble), verified.
			r, err = h.d.BatchGet(context.Background(), &pb.GetRequest{Session: ses, Keys: []string{"b"}, DeadlineMs: 5000})
			if err != nil {
				t.Fatal(err)
			}
			if p := r.GetPages()[0]; p.GetStatus() != pb.GetStatus_GET_STATUS_HIT || p.GetTier() != pb.Tier_TIER_L3 {
				t.Fatalf("get after the report: %v from %v, want a reload from the store", p.GetStatus(), p.GetTier())
			}
			if _, err := h.d.Release(context.Background(), &pb.ReleaseRequest{Session: ses, Lease: r.GetLease()}); err != nil {
				t.Fatal(err)
			}
			if got := h.getVerify(t, ses, "b"); !got[0] {
				t.Fatal("the reloaded page did not verify")
			}
		}},
		{"reloads from the store carry sums", func(t *testing.T, h *harness, ses string) {
			keys := make([]string, 0, 12)
			for i := range 3 {
				ks := []string{"r" + string(rune('a'+4*i)), "r" + string(rune('b'+4*i)), "r" + string(rune('c'+4*i)), "r" + string(rune('d'+4*i))}
				h.setSums(t, ses, nil, ks...)
				waitEvictable(t, h.d)
				keys = append(keys, ks...)
			}
			// The slab holds 8 pages: the first ones are in the store alone.
			got := h.getVerify(t, ses, keys[:4]...)
			if !equalBools(got, []bool{true, true, true, true}) {
				t.Fatalf("reloaded pages verified %v", got)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 8, false, nil, Limits{})
			tc.run(t, h, h.register(t))
		})
	}
}

// TestClientSumsBadInput: a Commit whose sums have the wrong count and a
// Release naming a position past its get's keys are refused, naming the
// field, and leave the lease as it was.
func TestClientSumsBadInput(t *testing.T) {
	h := newHarness(t, 8, false, nil, Limits{})
	ses := h.register(t)
	ctx := context.Background()
	r, err := h.d.BatchSet(ctx, &pb.SetRequest{Session: ses, Keys: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 3, 5} {
		_, err := h.d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: []bool{true, true}, Sums: make([]uint32, n)})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "sums: ") {
			t.Fatalf("%d sums for 2 keys x 2 kinds: %v", n, err)
		}
	}
	for i, p := range r.GetPages() {
		for k, s := range p.GetSpans() {
			copy(h.bytesOf(t, s), page([]string{"a", "b"}[i], k, int64(s.GetLength())))
		}
	}
	if _, err := h.d.Commit(ctx, &pb.CommitRequest{Session: ses, Lease: r.GetLease(), Written: []bool{true, true}}); err != nil {
		t.Fatalf("the lease did not survive the refused Commits: %v", err)
	}
	g, err := h.d.BatchGet(ctx, &pb.GetRequest{Session: ses, Keys: []string{"a", "b"}, ClientVerifies: true, DeadlineMs: 5000})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: g.GetLease(), Corrupt: []uint32{1, 2}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "corrupt[1]: position 2") {
		t.Fatalf("a corrupt position past the keys: %v", err)
	}
	if _, err := h.d.Release(ctx, &pb.ReleaseRequest{Session: ses, Lease: g.GetLease()}); err != nil {
		t.Fatalf("the lease did not survive the refused Release: %v", err)
	}
	if got := h.getVerify(t, ses, "a", "b"); !equalBools(got, []bool{true, true}) {
		t.Fatalf("verified %v after the refusals", got)
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func allStatus(s []pb.GetStatus, want pb.GetStatus) bool {
	for _, x := range s {
		if x != want {
			return false
		}
	}
	return true
}
