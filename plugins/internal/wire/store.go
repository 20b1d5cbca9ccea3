package wire

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/plugins/proto/storev1"
	"github.com/kvtier/kvtier/tiers"
)

// StoreKey encodes a key.
func StoreKey(k tiers.Key) *storev1.Key {
	return &storev1.Key{Hash: k.Hash[:], Kind: uint32(k.Kind)}
}

// FromStoreKey decodes a key; kinds bounds the payload kind (0: any byte).
func FromStoreKey(k *storev1.Key, kinds int) (tiers.Key, error) {
	if k == nil {
		return tiers.Key{}, fmt.Errorf("key missing: %w", ErrMalformed)
	}
	h, err := Hash(k.GetHash())
	if err != nil {
		return tiers.Key{}, err
	}
	kind, err := Kind(k.GetKind(), kinds)
	if err != nil {
		return tiers.Key{}, err
	}
	return tiers.Key{Hash: h, Kind: tiers.PayloadKind(kind)}, nil
}

// StoreKeys encodes keys.
func StoreKeys(keys []tiers.Key) []*storev1.Key {
	out := make([]*storev1.Key, len(keys))
	for i, k := range keys {
		out[i] = StoreKey(k)
	}
	return out
}

// FromStoreKeys decodes keys.
func FromStoreKeys(keys []*storev1.Key, kinds int) ([]tiers.Key, error) {
	out := make([]tiers.Key, len(keys))
	for i, k := range keys {
		var err error
		if out[i], err = FromStoreKey(k, kinds); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
	}
	return out, nil
}

// Span encodes a slab span.
func Span(s tiers.Span) *storev1.Span {
	return &storev1.Span{Slab: uint32(s.Slab), Offset: s.Offset, Length: s.Length}
}

// FromSpan decodes a slab span. Range checks are the slab's (Bytes).
func FromSpan(s *storev1.Span) (tiers.Span, error) {
	if s == nil {
		return tiers.Span{}, fmt.Errorf("span missing: %w", ErrMalformed)
	}
	return tiers.Span{Slab: tiers.SlabID(s.GetSlab()), Offset: s.GetOffset(), Length: s.GetLength()}, nil
}

// ResultCode classifies a per-item error of a Store.
func ResultCode(err error) storev1.ResultCode {
	switch {
	case err == nil:
		return storev1.ResultCode_RESULT_CODE_OK
	case errors.Is(err, tiers.ErrMiss):
		return storev1.ResultCode_RESULT_CODE_MISS
	case errors.Is(err, tiers.ErrInvalid):
		return storev1.ResultCode_RESULT_CODE_INVALID
	case errors.Is(err, tiers.ErrFull):
		return storev1.ResultCode_RESULT_CODE_FULL
	case errors.Is(err, tiers.ErrClosed):
		return storev1.ResultCode_RESULT_CODE_CLOSED
	case errors.Is(err, tiers.ErrBroken):
		return storev1.ResultCode_RESULT_CODE_BROKEN
	}
	return storev1.ResultCode_RESULT_CODE_FAILED
}

// Result encodes a per-item error.
func Result(err error) *storev1.ItemResult {
	r := &storev1.ItemResult{Code: ResultCode(err)}
	if err != nil {
		r.Message = err.Error()
	}
	return r
}

// errRemote is a per-item error reported by a plugin: its message, wrapping
// the sentinel its code names.
type errRemote struct {
	msg      string
	sentinel error
}

// Error returns the plugin's message.
func (e *errRemote) Error() string {
	if e.msg == "" {
		return e.sentinel.Error()
	}
	return e.msg
}

// Unwrap returns the sentinel the result code names.
func (e *errRemote) Unwrap() error { return e.sentinel }

// FromResult decodes a per-item result: nil for OK, an error wrapping the
// code's sentinel otherwise (ErrMiss, ErrInvalid, ErrFull, ErrClosed,
// ErrBroken; FAILED wraps nothing). An unset or unknown code is ErrMalformed.
func FromResult(code storev1.ResultCode, msg string) (error, error) {
	var sentinel error
	switch code {
	case storev1.ResultCode_RESULT_CODE_OK:
		return nil, nil
	case storev1.ResultCode_RESULT_CODE_MISS:
		sentinel = tiers.ErrMiss
	case storev1.ResultCode_RESULT_CODE_INVALID:
		sentinel = tiers.ErrInvalid
	case storev1.ResultCode_RESULT_CODE_FULL:
		sentinel = tiers.ErrFull
	case storev1.ResultCode_RESULT_CODE_CLOSED:
		sentinel = tiers.ErrClosed
	case storev1.ResultCode_RESULT_CODE_BROKEN:
		sentinel = tiers.ErrBroken
	case storev1.ResultCode_RESULT_CODE_FAILED:
		if msg == "" {
			msg = "put failed"
		}
		return errors.New(msg), nil
	default:
		return nil, fmt.Errorf("result code %d: %w", code, ErrMalformed)
	}
	return &errRemote{msg: msg, sentinel: sentinel}, nil
}

// AckStage encodes an ack stage.
func AckStage(s tiers.AckStage) storev1.AckStage {
	switch s {
	case tiers.AckGathered:
		return storev1.AckStage_ACK_STAGE_GATHERED
	case tiers.AckDurable:
		return storev1.AckStage_ACK_STAGE_DURABLE
	case tiers.AckFailed:
		return storev1.AckStage_ACK_STAGE_FAILED
	}
	return storev1.AckStage_ACK_STAGE_UNSPECIFIED
}

// FromAckStage decodes an ack stage; an unset or unknown one is ErrMalformed.
func FromAckStage(s storev1.AckStage) (tiers.AckStage, error) {
	switch s {
	case storev1.AckStage_ACK_STAGE_GATHERED:
		return tiers.AckGathered, nil
	case storev1.AckStage_ACK_STAGE_DURABLE:
		return tiers.AckDurable, nil
	case storev1.AckStage_ACK_STAGE_FAILED:
		return tiers.AckFailed, nil
	}
	return 0, fmt.Errorf("ack stage %d: %w", s, ErrMalformed)
}

// ColdStart encodes a cold-start mode.
func ColdStart(c tiers.ColdStart) storev1.ColdStart {
	switch c {
	case tiers.ColdStartClear:
		return storev1.ColdStart_COLD_START_CLEAR
	case tiers.ColdStartLoad:
		return storev1.ColdStart_COLD_START_LOAD
	}
	return storev1.ColdStart_COLD_START_UNSPECIFIED
}

// FromColdStart decodes a cold-start mode.
func FromColdStart(c storev1.ColdStart) (tiers.ColdStart, error) {
	switch c {
	case storev1.ColdStart_COLD_START_CLEAR:
		return tiers.ColdStartClear, nil
	case storev1.ColdStart_COLD_START_LOAD:
		return tiers.ColdStartLoad, nil
	}
	return "", fmt.Errorf("cold start %d: %w", c, ErrMalformed)
}

// Payload encodes the payload geometry.
func Payload(g tiers.PayloadGeometry) *storev1.PayloadGeometry {
	out := &storev1.PayloadGeometry{PageTokens: uint32(g.PageTokens)}
	for _, k := range g.Kinds {
		out.Kinds = append(out.Kinds, &storev1.PayloadSpec{Name: k.Name, PageBytes: k.PageBytes})
	}
	return out
}

// FromPayload decodes the payload geometry.
func FromPayload(g *storev1.PayloadGeometry) (tiers.PayloadGeometry, error) {
	if g == nil || g.GetPageTokens() == 0 || len(g.GetKinds()) == 0 || len(g.GetKinds()) > 256 {
		return tiers.PayloadGeometry{}, fmt.Errorf("payload geometry %v: %w", g, ErrMalformed)
	}
	out := tiers.PayloadGeometry{PageTokens: int(g.GetPageTokens())}
	for i, k := range g.GetKinds() {
		if k.GetPageBytes() <= 0 {
			return tiers.PayloadGeometry{}, fmt.Errorf("payload kind %d %q: page_bytes %d: %w", i, k.GetName(), k.GetPageBytes(), ErrMalformed)
		}
		out.Kinds = append(out.Kinds, tiers.PayloadSpec{Name: k.GetName(), PageBytes: k.GetPageBytes()})
	}
	return out, nil
}

// Slab encodes a slab geometry.
func Slab(g tiers.SlabGeometry) *storev1.SlabGeometry {
	out := &storev1.SlabGeometry{PageSize: g.PageSize, Backing: g.Backing, StackId: g.StackID}
	for _, f := range g.Slabs {
		out.Slabs = append(out.Slabs, &storev1.SlabFile{Id: uint32(f.ID), Path: f.Path, Size: f.Size})
	}
	return out
}

// FromSlab decodes a slab geometry.
func FromSlab(g *storev1.SlabGeometry) (tiers.SlabGeometry, error) {
	if g == nil || len(g.GetSlabs()) == 0 {
		return tiers.SlabGeometry{}, fmt.Errorf("slab geometry lists no slab files: %w", ErrMalformed)
	}
	out := tiers.SlabGeometry{PageSize: g.GetPageSize(), Backing: g.GetBacking(), StackID: g.GetStackId()}
	for _, f := range g.GetSlabs() {
		out.Slabs = append(out.Slabs, tiers.SlabFile{ID: tiers.SlabID(f.GetId()), Path: f.GetPath(), Size: f.GetSize()})
	}
	return out, nil
}

// Stats encodes store stats.
func Stats(s tiers.StoreStats) *storev1.StatsReply {
	return &storev1.StatsReply{
		Pages: s.Pages, Bytes: s.Bytes, CapacityBytes: s.CapacityBytes,
		Hits: s.Hits, Misses: s.Misses, Corrupt: s.Corrupt,
		Puts: s.Puts, PutFailures: s.PutFailures, Evictions: s.Evictions,
	}
}

// FromStats decodes store stats; negative counters are ErrMalformed.
func FromStats(r *storev1.StatsReply) (tiers.StoreStats, error) {
	s := tiers.StoreStats{
		Pages: r.GetPages(), Bytes: r.GetBytes(), CapacityBytes: r.GetCapacityBytes(),
		Hits: r.GetHits(), Misses: r.GetMisses(), Corrupt: r.GetCorrupt(),
		Puts: r.GetPuts(), PutFailures: r.GetPutFailures(), Evictions: r.GetEvictions(),
	}
	for _, v := range []int64{s.Pages, s.Bytes, s.CapacityBytes, s.Hits, s.Misses, s.Corrupt, s.Puts, s.PutFailures, s.Evictions} {
		if v < 0 {
			return tiers.StoreStats{}, fmt.Errorf("store stats %+v: negative counter: %w", s, ErrMalformed)
		}
	}
	return s, nil
}

// StoreStatus turns a Store method's error into the gRPC status the
// protocol prescribes (plugin side).
func StoreStatus(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, tiers.ErrInvalid), errors.Is(err, ErrMalformed):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, tiers.ErrClosed):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// CallKind classifies the error of a call to a plugin (host side).
type CallKind int

const (
	// CallInvalid: the plugin refused the request as malformed; the
	// plugin is healthy and the error wraps ErrInvalid.
	CallInvalid CallKind = iota + 1
	// CallClosed: the plugin says it is closed.
	CallClosed
	// CallTimeout: the call ran past its deadline; the plugin hangs.
	CallTimeout
	// CallBroken: the plugin failed, crashed or the connection broke.
	CallBroken
	// CallFull: the plugin says it is full (index).
	CallFull
	// CallInUse: the plugin says another process holds its files (index).
	CallInUse
	// CallCorrupt: the plugin found a corrupt record (index).
	CallCorrupt
)

// Classify maps a gRPC error from a plugin call to a CallKind.
func Classify(err error) CallKind {
	switch status.Code(err) {
	case codes.InvalidArgument:
		return CallInvalid
	case codes.FailedPrecondition:
		return CallClosed
	case codes.DeadlineExceeded:
		return CallTimeout
	case codes.ResourceExhausted:
		return CallFull
	case codes.Aborted:
		return CallInUse
	case codes.DataLoss:
		return CallCorrupt
	}
	return CallBroken
}

// Message returns the plugin's own error text of a gRPC error.
func Message(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// CallError returns the error of a call to or from a plugin for wrapping
// with %w: its text is the plugin's own message (Message), without gRPC's
// "rpc error: code = ... desc =" prefix, and it still wraps err, so
// errors.Is, errors.As and status.Code see through it. nil stays nil.
func CallError(err error) error {
	if err == nil {
		return nil
	}
	return &callError{err: err}
}

type callError struct{ err error }

func (e *callError) Error() string { return Message(e.err) }
func (e *callError) Unwrap() error { return e.err }
