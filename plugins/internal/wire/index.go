package wire

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/indexes"
	"github.com/kvtier/kvtier/plugins/proto/indexv1"
)

// IndexKey encodes an index key.
func IndexKey(k indexes.Key) *indexv1.Key {
	return &indexv1.Key{Hash: k.Hash[:], Kind: uint32(k.Kind)}
}

// FromIndexKey decodes an index key.
func FromIndexKey(k *indexv1.Key) (indexes.Key, error) {
	if k == nil {
		return indexes.Key{}, fmt.Errorf("key missing: %w", ErrMalformed)
	}
	h, err := Hash(k.GetHash())
	if err != nil {
		return indexes.Key{}, err
	}
	kind, err := Kind(k.GetKind(), 0)
	if err != nil {
		return indexes.Key{}, err
	}
	return indexes.Key{Hash: h, Kind: kind}, nil
}

// IndexKeys encodes keys.
func IndexKeys(keys []indexes.Key) []*indexv1.Key {
	out := make([]*indexv1.Key, len(keys))
	for i, k := range keys {
		out[i] = IndexKey(k)
	}
	return out
}

// FromIndexKeys decodes keys.
func FromIndexKeys(keys []*indexv1.Key) ([]indexes.Key, error) {
	out := make([]indexes.Key, len(keys))
	for i, k := range keys {
		var err error
		if out[i], err = FromIndexKey(k); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
	}
	return out, nil
}

// Record encodes a record.
func Record(r indexes.Record) *indexv1.Record {
	return &indexv1.Record{Disk: uint32(r.Disk), Kind: uint32(r.Kind), Slot: r.Slot, Epoch: r.Epoch, LastAccess: r.LastAccess}
}

// FromRecord decodes a record; out-of-range disk or kind is ErrMalformed.
func FromRecord(r *indexv1.Record) (indexes.Record, error) {
	if r == nil {
		return indexes.Record{}, fmt.Errorf("record missing: %w", ErrMalformed)
	}
	if r.GetDisk() > 0xffff {
		return indexes.Record{}, fmt.Errorf("record disk %d: %w", r.GetDisk(), ErrMalformed)
	}
	kind, err := Kind(r.GetKind(), 0)
	if err != nil {
		return indexes.Record{}, fmt.Errorf("record: %w", err)
	}
	return indexes.Record{Disk: uint16(r.GetDisk()), Kind: kind, Slot: r.GetSlot(), Epoch: r.GetEpoch(), LastAccess: r.GetLastAccess()}, nil
}

// Entries encodes entries.
func Entries(es []indexes.Entry) []*indexv1.Entry {
	out := make([]*indexv1.Entry, len(es))
	for i, e := range es {
		out[i] = &indexv1.Entry{Key: IndexKey(e.Key), Record: Record(e.Record)}
	}
	return out
}

// FromEntries decodes entries.
func FromEntries(es []*indexv1.Entry) ([]indexes.Entry, error) {
	out := make([]indexes.Entry, len(es))
	for i, e := range es {
		k, err := FromIndexKey(e.GetKey())
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		r, err := FromRecord(e.GetRecord())
		if err != nil {
			return nil, fmt.Errorf("entry %d (%s): %w", i, k, err)
		}
		out[i] = indexes.Entry{Key: k, Record: r}
	}
	return out, nil
}

// IndexStatus turns an Index method's error into the gRPC status the
// protocol prescribes (plugin side).
func IndexStatus(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, indexes.ErrFull):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, indexes.ErrInUse):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, indexes.ErrCorrupt):
		return status.Error(codes.DataLoss, err.Error())
	case errors.Is(err, indexes.ErrClosed):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, ErrMalformed):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
