package wire

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

func TestResultRoundTrip(t *testing.T) {
	cases := []struct {
		name     string
		err      error
		code     storev1.ResultCode
		sentinel error
	}{
		{"hit", nil, storev1.ResultCode_RESULT_CODE_OK, nil},
		{"miss", errors.New("x: " + tiers.ErrMiss.Error()), storev1.ResultCode_RESULT_CODE_FAILED, nil},
		{"wrapped miss", wrap(tiers.ErrMiss), storev1.ResultCode_RESULT_CODE_MISS, tiers.ErrMiss},
		{"invalid", wrap(tiers.ErrInvalid), storev1.ResultCode_RESULT_CODE_INVALID, tiers.ErrInvalid},
		{"full", wrap(tiers.ErrFull), storev1.ResultCode_RESULT_CODE_FULL, tiers.ErrFull},
		{"closed", wrap(tiers.ErrClosed), storev1.ResultCode_RESULT_CODE_CLOSED, tiers.ErrClosed},
		{"broken", wrap(tiers.ErrBroken), storev1.ResultCode_RESULT_CODE_BROKEN, tiers.ErrBroken},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Result(tc.err)
			if r.Code != tc.code {
				t.Fatalf("code %v, want %v", r.Code, tc.code)
			}
			back, err := FromResult(r.Code, r.Message)
			if err != nil {
				t.Fatal(err)
			}
			if (back == nil) != (tc.err == nil) {
				t.Fatalf("decoded %v from %v", back, tc.err)
			}
			if tc.sentinel != nil && !errors.Is(back, tc.sentinel) {
				t.Fatalf("decoded %v does not wrap %v", back, tc.sentinel)
			}
			if tc.err != nil && back.Error() != tc.err.Error() {
				t.Fatalf("message %q, want %q", back.Error(), tc.err.Error())
			}
		})
	}
	for _, bad := range []storev1.ResultCode{storev1.ResultCode_RESULT_CODE_UNSPECIFIED, 99, -1} {
		if _, err := FromResult(bad, ""); !errors.Is(err, ErrMalformed) {
			t.Errorf("code %d: err %v, want ErrMalformed", bad, err)
		}
	}
}

func wrap(err error) error { return errors.Join(errors.New("ctx"), err) }

func TestStoreKeyChecks(t *testing.T) {
	h := pagehash.Next(pagehash.Root, []uint32{1, 2, 3})
	k, err := FromStoreKey(StoreKey(tiers.Key{Hash: h, Kind: 1}), 2)
	if err != nil || k.Hash != h || k.Kind != 1 {
		t.Fatalf("round trip: %v %v", k, err)
	}
	for name, bad := range map[string]*storev1.Key{
		"nil":        nil,
		"short hash": {Hash: h[:31], Kind: 0},
		"long hash":  {Hash: append(h[:], 0), Kind: 0},
		"kind range": {Hash: h[:], Kind: 2},
		"kind byte":  {Hash: h[:], Kind: 256},
	} {
		if _, err := FromStoreKey(bad, 2); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

func TestGeometryRoundTrip(t *testing.T) {
	g := tiers.PayloadGeometry{PageTokens: 64, Kinds: []tiers.PayloadSpec{{Name: "kv", PageBytes: 2816 << 10}, {Name: "index", PageBytes: 4096}}}
	back, err := FromPayload(Payload(g))
	if err != nil || back.PageTokens != 64 || len(back.Kinds) != 2 || back.Kinds[0] != g.Kinds[0] {
		t.Fatalf("payload round trip: %+v %v", back, err)
	}
	sg := tiers.SlabGeometry{Slabs: []tiers.SlabFile{{ID: 0, Path: "/dev/hugepages/a", Size: 1 << 30}}, PageSize: 2 << 20, Backing: "hugetlbfs", StackID: "s"}
	sback, err := FromSlab(Slab(sg))
	if err != nil || sback.Slabs[0] != sg.Slabs[0] || sback.PageSize != sg.PageSize || sback.Backing != sg.Backing || sback.StackID != "s" {
		t.Fatalf("slab round trip: %+v %v", sback, err)
	}
	for name, bad := range map[string]*storev1.PayloadGeometry{
		"nil":        nil,
		"no tokens":  {Kinds: []*storev1.PayloadSpec{{PageBytes: 1}}},
		"no kinds":   {PageTokens: 1},
		"zero bytes": {PageTokens: 1, Kinds: []*storev1.PayloadSpec{{PageBytes: 0}}},
	} {
		if _, err := FromPayload(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("payload %s: err %v, want ErrMalformed", name, err)
		}
	}
	if _, err := FromSlab(&storev1.SlabGeometry{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty slab geometry: err %v", err)
	}
}

func TestStatusMapping(t *testing.T) {
	cases := []struct {
		err  error
		kind CallKind
	}{
		{StoreStatus(wrap(tiers.ErrInvalid)), CallInvalid},
		{StoreStatus(wrap(tiers.ErrClosed)), CallClosed},
		{StoreStatus(errors.New("disk on fire")), CallBroken},
		{IndexStatus(wrap(indexes.ErrFull)), CallFull},
		{IndexStatus(wrap(indexes.ErrInUse)), CallInUse},
		{IndexStatus(wrap(indexes.ErrCorrupt)), CallCorrupt},
		{IndexStatus(wrap(indexes.ErrClosed)), CallClosed},
		{IndexStatus(errors.New("x")), CallBroken},
		{status.Error(codes.DeadlineExceeded, "slow"), CallTimeout},
		{status.Error(codes.Unavailable, "gone"), CallBroken},
		{errors.New("not a status"), CallBroken},
	}
	for i, c := range cases {
		if got := Classify(c.err); got != c.kind {
			t.Errorf("case %d (%v): kind %d, want %d", i, c.err, got, c.kind)
		}
	}
	if StoreStatus(nil) != nil || IndexStatus(nil) != nil {
		t.Error("nil error mapped to a status")
	}
	if Message(StoreStatus(errors.New("why"))) != "why" {
		t.Error("status message lost")
	}
}

func TestRecordChecks(t *testing.T) {
	r := indexes.Record{Disk: 3, Kind: 1, Slot: 9, Epoch: 2, LastAccess: 7}
	back, err := FromRecord(Record(r))
	if err != nil || back != r {
		t.Fatalf("record round trip: %+v %v", back, err)
	}
	for name, bad := range map[string]*indexv1.Record{
		"nil":  nil,
		"disk": {Disk: 1 << 16},
		"kind": {Kind: 256},
	} {
		if _, err := FromRecord(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzStoreReplies feeds arbitrary bytes, as a plugin might send them, to
// the decoders of every store reply the host reads. They must never panic,
// and a decoded hit must come from an explicit OK code.
func FuzzStoreReplies(f *testing.F) {
	seed := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&storev1.GetReply{Results: []*storev1.ItemResult{{Code: storev1.ResultCode_RESULT_CODE_OK}, {Code: storev1.ResultCode_RESULT_CODE_MISS, Message: "gone"}}})
	seed(&storev1.AckBatch{Acks: []*storev1.Ack{{Batch: 1, Index: 0, Stage: storev1.AckStage_ACK_STAGE_DURABLE, Code: storev1.ResultCode_RESULT_CODE_OK}}})
	seed(&storev1.StatsReply{Pages: 1, Bytes: -4})
	seed(&storev1.OpenRequest{Payload: &storev1.PayloadGeometry{PageTokens: 1, Kinds: []*storev1.PayloadSpec{{PageBytes: 1}}}})
	f.Add([]byte{0x0a, 0x02, 0x08, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var gr storev1.GetReply
		if proto.Unmarshal(b, &gr) == nil {
			for _, r := range gr.GetResults() {
				e, err := FromResult(r.GetCode(), r.GetMessage())
				if err == nil && e == nil && r.GetCode() != storev1.ResultCode_RESULT_CODE_OK {
					t.Fatalf("code %v decoded as a hit", r.GetCode())
				}
			}
		}
		var ab storev1.AckBatch
		if proto.Unmarshal(b, &ab) == nil {
			for _, a := range ab.GetAcks() {
				_, _ = FromAckStage(a.GetStage())
				_, _ = FromResult(a.GetCode(), a.GetMessage())
			}
		}
		var st storev1.StatsReply
		if proto.Unmarshal(b, &st) == nil {
			if s, err := FromStats(&st); err == nil && (s.Pages < 0 || s.Bytes < 0) {
				t.Fatalf("negative stats accepted: %+v", s)
			}
		}
		var or storev1.OpenRequest
		if proto.Unmarshal(b, &or) == nil {
			_, _ = FromPayload(or.GetPayload())
			_, _ = FromSlab(or.GetSlab())
			_, _ = FromColdStart(or.GetColdStart())
		}
		var pr storev1.PutRequest
		if proto.Unmarshal(b, &pr) == nil {
			for _, it := range pr.GetItems() {
				_, _ = FromStoreKey(it.GetKey(), 4)
				_, _ = FromSpan(it.GetSrc())
			}
		}
	})
}

// FuzzIndexEntries decodes arbitrary bytes as the index messages a plugin
// (or a host) sends; decoders must never panic and must keep kinds and
// disks in range.
func FuzzIndexEntries(f *testing.F) {
	b, _ := proto.Marshal(&indexv1.IterateBatch{Entries: []*indexv1.Entry{{Key: &indexv1.Key{Hash: make([]byte, 32), Kind: 1}, Record: &indexv1.Record{Disk: 2, Kind: 1, Slot: 3}}}})
	f.Add(b)
	b, _ = proto.Marshal(&indexv1.GetReply{Results: []*indexv1.Lookup{{Found: true, Record: &indexv1.Record{Disk: 70000}}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var ib indexv1.IterateBatch
		if proto.Unmarshal(b, &ib) == nil {
			es, err := FromEntries(ib.GetEntries())
			if err == nil && len(es) != len(ib.GetEntries()) {
				t.Fatalf("%d entries decoded from %d", len(es), len(ib.GetEntries()))
			}
		}
		var gr indexv1.GetReply
		if proto.Unmarshal(b, &gr) == nil {
			for _, l := range gr.GetResults() {
				if r, err := FromRecord(l.GetRecord()); err == nil && l.GetRecord().GetDisk() != uint32(r.Disk) {
					t.Fatalf("disk %d decoded as %d", l.GetRecord().GetDisk(), r.Disk)
				}
			}
		}
	})
}

func TestCallError(t *testing.T) {
	if CallError(nil) != nil {
		t.Fatal("CallError(nil) is not nil")
	}
	plain := errors.New("plain")
	cases := []struct {
		name string
		err  error
		text string
		code codes.Code
	}{
		{"status", status.Error(codes.ResourceExhausted, "store full"), "store full", codes.ResourceExhausted},
		{"deadline", status.Error(codes.DeadlineExceeded, "too slow"), "too slow", codes.DeadlineExceeded},
		{"plain", plain, "plain", codes.Unknown},
	}
	for _, tc := range cases {
		got := CallError(tc.err)
		if got.Error() != tc.text {
			t.Errorf("%s: text %q, want %q", tc.name, got, tc.text)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("%s: %v does not wrap %v", tc.name, got, tc.err)
		}
		if c := status.Code(got); c != tc.code {
			t.Errorf("%s: status code %v through the wrapper, want %v", tc.name, c, tc.code)
		}
		if k := Classify(got); k != Classify(tc.err) {
			t.Errorf("%s: classified %v through the wrapper, %v without", tc.name, k, Classify(tc.err))
		}
	}
}
