package tcpgroup

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// rawCodec carries the consensus wire encoding as the whole gRPC message:
// the message already has a strict, fuzzed decoder (consensus.Decode*),
// so a protobuf wrapper would add a second decoder and a copy for nothing.
type rawCodec struct{}

var _ encoding.CodecV2 = rawCodec{}

// Marshal passes the bytes through without copying.
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch b := v.(type) {
	case []byte:
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	case *[]byte:
		return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
	}
	return nil, fmt.Errorf("tcpgroup: raw codec cannot marshal %T", v)
}

// Unmarshal copies the message into *v (gRPC frees data on return).
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("tcpgroup: raw codec cannot unmarshal into %T", v)
	}
	*b = data.Materialize()
	return nil
}

// Name is the content subtype both ends force.
func (rawCodec) Name() string { return "kvtier-consensus-raw" }
