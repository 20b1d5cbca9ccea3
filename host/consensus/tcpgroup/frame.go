package tcpgroup

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/kvtier/kvtier/host/consensus"
)

// Frames on a connection, both ways:
//
//	0 u32 little endian: the length of what follows (type and body)
//	4 type: frameContribution (rank to hub), frameFrontier (hub to rank)
//	  or frameError (hub to rank, then the hub closes the connection)
//	5 body: the consensus wire encoding, or for an error a code (codeOf)
//	  and a message
const (
	frameContribution = 1
	frameFrontier     = 2
	frameError        = 3
	frameHeader       = 5
)

// maxErrorMessage bounds the message of a frameError.
const maxErrorMessage = 4096

// maxFrame bounds a frame's length: the largest message a valid shape
// encodes to, or an error; anything longer is refused before it is read.
var maxFrame = max(consensus.MaxEncodedLen, maxErrorMessage) + 1 + 64

// errFrame marks bytes that are not a frame.
var errFrame = fmt.Errorf("not a tcpgroup frame: %w", consensus.ErrMalformed)

// writeFrame writes one frame in one write, built in *scratch (grown as
// needed, kept for the next frame; nil: a fresh buffer).
func writeFrame(w io.Writer, typ byte, body []byte, scratch *[]byte) error {
	var b []byte
	if scratch != nil {
		b = (*scratch)[:0]
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(1+len(body)))
	b = append(append(b, typ), body...)
	if scratch != nil {
		*scratch = b
	}
	_, err := w.Write(b)
	return err
}

// readFrame reads one frame into buf (grown as needed) and returns its
// type, its body (in buf) and buf.
func readFrame(r *bufio.Reader, buf []byte) (byte, []byte, []byte, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, buf, fmt.Errorf("%w: a header cut short", errFrame)
		}
		return 0, nil, buf, err
	}
	n := int(binary.LittleEndian.Uint32(h[:4]))
	if n < 1 || n > maxFrame {
		return 0, nil, buf, fmt.Errorf("%w: length %d, want 1..%d", errFrame, n, maxFrame)
	}
	if cap(buf) < n-1 {
		buf = make([]byte, n-1)
	}
	body := buf[:n-1]
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return 0, nil, buf, fmt.Errorf("%w: a body of %d bytes cut short", errFrame, n-1)
		}
		return 0, nil, buf, err
	}
	return h[4], body, buf, nil
}
