package consensus

import (
	"encoding/binary"
	"fmt"
)

// Wire layout, little endian, one message per contribution or frontier:
//
//	0  magic "KVC1"
//	4  kind (1 contribution, 2 frontier), flags (bit 0: digest), 2 zero bytes
//	8  group id u64, stack id u64, tick u64
//	32 rank u32 (0xffffffff for a frontier), group size u32
//	40 classes u16, structures u16, ok bits u32, reloads u32
//	52 counts: classes × 4 × u64 (gathered, durable, reloaded, l1copied)
//	   ok bits packed in u64 words, unused bits zero
//	   prefixes: reloads × u32
//	   digest (32 bytes) when flag 0, then structures × 32 bytes
//
// The length is exactly what the header implies; anything else is refused.
const (
	headerLen     = 52
	kindContrib   = 1
	kindFrontier  = 2
	flagDigest    = 1
	frontierRank  = 0xffffffff
	countsPerSlot = 4
)

var magic = [4]byte{'K', 'V', 'C', '1'}

// Envelope is what the wire adds to a contribution or frontier: the group
// and stack it belongs to, and who sent it.
type Envelope struct {
	// Group identifies the rank group (e.g. a hash of the deployment).
	Group uint64
	// Stack identifies the opened tier stack the group decides for.
	Stack uint64
	// Rank is the sender's rank, or -1 for a frontier.
	Rank int
	// Size is the group's size.
	Size int
}

// MaxEncodedLen is the largest message a valid shape encodes to.
var MaxEncodedLen = encodedLen(Shape{Classes: MaxClasses, OKBits: MaxOKBits, Reloads: MaxReloads, Digest: true, Structures: int(NumStructures)})

func encodedLen(s Shape) int {
	n := headerLen + s.Classes*countsPerSlot*8 + (s.OKBits+63)/64*8 + s.Reloads*4
	if s.Digest {
		n += 32 * (1 + s.Structures)
	}
	return n
}

// AppendContribution appends the encoding of c sent by env.Rank to dst.
// c must pass Check.
func AppendContribution(dst []byte, env Envelope, c Contribution) ([]byte, error) {
	if err := c.Check(); err != nil {
		return dst, fmt.Errorf("consensus: encode %s tick %d: %w", RankName(env.Rank), c.Tick, err)
	}
	if env.Rank < 0 || env.Rank >= env.Size || env.Size > MaxGroupSize {
		return dst, fmt.Errorf("consensus: encode: rank %d of a group of %d (at most %d): %w", env.Rank, env.Size, MaxGroupSize, ErrForeign)
	}
	return appendMsg(dst, kindContrib, env, c), nil
}

// AppendFrontier appends the encoding of f to dst; env.Rank is ignored.
func AppendFrontier(dst []byte, env Envelope, f Frontier) ([]byte, error) {
	if err := f.Check(); err != nil {
		return dst, fmt.Errorf("consensus: encode frontier tick %d: %w", f.Tick, err)
	}
	if env.Size < 1 || env.Size > MaxGroupSize {
		return dst, fmt.Errorf("consensus: encode frontier: group of %d (want 1..%d): %w", env.Size, MaxGroupSize, ErrForeign)
	}
	env.Rank = -1
	return appendMsg(dst, kindFrontier, env, Contribution(f)), nil
}

func appendMsg(dst []byte, kind byte, env Envelope, c Contribution) []byte {
	s := c.Shape
	le := binary.LittleEndian
	dst = append(dst, magic[:]...)
	var flags byte
	if s.Digest {
		flags |= flagDigest
	}
	dst = append(dst, kind, flags, 0, 0)
	dst = le.AppendUint64(dst, env.Group)
	dst = le.AppendUint64(dst, env.Stack)
	dst = le.AppendUint64(dst, c.Tick)
	rank := uint32(frontierRank)
	if env.Rank >= 0 {
		rank = uint32(env.Rank)
	}
	dst = le.AppendUint32(dst, rank)
	dst = le.AppendUint32(dst, uint32(env.Size))
	dst = le.AppendUint16(dst, uint16(s.Classes))
	dst = le.AppendUint16(dst, uint16(s.Structures))
	dst = le.AppendUint32(dst, uint32(s.OKBits))
	dst = le.AppendUint32(dst, uint32(s.Reloads))
	for _, k := range c.Counts {
		dst = le.AppendUint64(dst, k.Gathered)
		dst = le.AppendUint64(dst, k.Durable)
		dst = le.AppendUint64(dst, k.Reloaded)
		dst = le.AppendUint64(dst, k.L1Copied)
	}
	for w := 0; w < len(c.OK); w += 64 {
		var word uint64
		for i := w; i < len(c.OK) && i < w+64; i++ {
			if c.OK[i] {
				word |= 1 << (i - w)
			}
		}
		dst = le.AppendUint64(dst, word)
	}
	for _, p := range c.Prefix {
		dst = le.AppendUint32(dst, p)
	}
	if s.Digest {
		dst = append(dst, c.Digest[:]...)
		for _, d := range c.Structures {
			dst = append(dst, d[:]...)
		}
	}
	return dst
}

// Expect is what a receiver knows before it reads a message.
type Expect struct {
	// Group and Stack must match the envelope's.
	Group, Stack uint64
	// Size is the group's size; the envelope's must match and a
	// contribution's rank must be below it.
	Size int
	// Peer names the sender for errors when the rank is not yet known
	// (e.g. its address); "" means "unknown peer".
	Peer string
}

// DecodeContribution decodes and validates one contribution. Its cost is
// linear in len(b) and it allocates at most a few times len(b). Every
// error is a *PeerError naming the claimed rank (with exp.Peer) and, when
// the bytes reach that far, the tick; it wraps ErrMalformed, ErrShape or
// ErrForeign. The caller checks the tick and the shape against its own
// (Reduce does).
func DecodeContribution(b []byte, exp Expect) (Envelope, Contribution, error) {
	return decode(b, exp, kindContrib)
}

// reuseContribution is NewContribution(tick, s) in dst's vectors when
// they are large enough (every element is overwritten by the decoder).
func reuseContribution(tick uint64, s Shape, dst Contribution) Contribution {
	if cap(dst.Counts) < s.Classes || cap(dst.OK) < s.OKBits || cap(dst.Prefix) < s.Reloads || cap(dst.Structures) < s.Structures {
		return NewContribution(tick, s)
	}
	c := Contribution{Tick: tick, Shape: s, Counts: dst.Counts[:s.Classes], OK: dst.OK[:s.OKBits], Prefix: dst.Prefix[:s.Reloads]}
	if s.Structures > 0 {
		c.Structures = dst.Structures[:s.Structures]
		clear(c.Structures) // NB: decoded only when the digest flag is set
	}
	return c
}

// DecodeFrontier decodes and validates one frontier, like
// DecodeContribution.
func DecodeFrontier(b []byte, exp Expect) (Envelope, Frontier, error) {
	env, c, err := decode(b, exp, kindFrontier)
	return env, Frontier(c), err
}

func decode(b []byte, exp Expect, kind byte) (Envelope, Contribution, error) {
	return decodeInto(b, exp, kind, Contribution{})
}

// DecodeContributionInto is DecodeContribution decoding into dst's
// vectors when they are large enough (the result then shares them with
// dst): a reader that decodes one contribution after another reuses one
// set of vectors instead of allocating per message.
func DecodeContributionInto(b []byte, exp Expect, dst Contribution) (Envelope, Contribution, error) {
	return decodeInto(b, exp, kindContrib, dst)
}

func decodeInto(b []byte, exp Expect, kind byte, dst Contribution) (Envelope, Contribution, error) {
	le := binary.LittleEndian
	var (
		tick      uint64
		tickKnown bool
		rank      uint32
	)
	// NB: the peer's name is formatted only for an error: a message that
	// decodes costs no allocation but its vectors.
	fail := func(format string, args ...any) (Envelope, Contribution, error) {
		pe := &PeerError{Peer: exp.Peer, Tick: tick, TickKnown: tickKnown, Err: fmt.Errorf(format, args...)}
		switch {
		case len(b) >= headerLen && kind == kindContrib && rank != frontierRank && exp.Peer != "":
			pe.Peer = fmt.Sprintf("rank %d (%s)", rank, exp.Peer)
		case len(b) >= headerLen && kind == kindContrib && rank != frontierRank:
			pe.Peer = RankName(int(rank))
		case len(b) >= headerLen && kind == kindFrontier && exp.Peer == "":
			pe.Peer = "the frontier's sender"
		case pe.Peer == "":
			pe.Peer = "unknown peer"
		}
		return Envelope{}, Contribution{}, pe
	}
	if len(b) < headerLen {
		if len(b) >= 32 {
			tick, tickKnown = le.Uint64(b[24:]), true
		}
		return fail("%d bytes, shorter than the %d-byte header: %w", len(b), headerLen, ErrMalformed)
	}
	tick, tickKnown = le.Uint64(b[24:]), true
	rank = le.Uint32(b[32:])
	env := Envelope{Group: le.Uint64(b[8:]), Stack: le.Uint64(b[16:]), Rank: -1, Size: int(le.Uint32(b[36:]))}
	if kind == kindContrib && rank != frontierRank {
		env.Rank = int(rank)
	}
	if [4]byte(b[:4]) != magic {
		return fail("bad magic %q: %w", b[:4], ErrMalformed)
	}
	if b[4] != kind {
		return fail("message kind %d, want %d: %w", b[4], kind, ErrMalformed)
	}
	if b[5]&^flagDigest != 0 || b[6] != 0 || b[7] != 0 {
		return fail("unknown flags %#x %#x %#x: %w", b[5], b[6], b[7], ErrMalformed)
	}
	if kind == kindContrib && rank == frontierRank {
		return fail("contribution without a rank: %w", ErrMalformed)
	}
	if kind == kindFrontier && rank != frontierRank {
		return fail("frontier with rank %d: %w", rank, ErrMalformed)
	}
	if env.Group != exp.Group || env.Stack != exp.Stack {
		return fail("group %#x stack %#x, want group %#x stack %#x: %w", env.Group, env.Stack, exp.Group, exp.Stack, ErrForeign)
	}
	if env.Size != exp.Size {
		return fail("group size %d, want %d: %w", env.Size, exp.Size, ErrForeign)
	}
	if env.Rank >= exp.Size {
		return fail("rank %d outside a group of %d: %w", env.Rank, exp.Size, ErrForeign)
	}
	s := Shape{
		Classes:    int(le.Uint16(b[40:])),
		Structures: int(le.Uint16(b[42:])),
		OKBits:     int(le.Uint32(b[44:])),
		Reloads:    int(le.Uint32(b[48:])),
		Digest:     b[5]&flagDigest != 0,
	}
	if err := s.Validate(); err != nil {
		return fail("%w", err)
	}
	if n := encodedLen(s); n != len(b) {
		return fail("%d bytes, shape %s needs %d: %w", len(b), s, n, ErrMalformed)
	}
	c := reuseContribution(tick, s, dst)
	p := b[headerLen:]
	for i := range c.Counts {
		c.Counts[i] = Counts{Gathered: le.Uint64(p), Durable: le.Uint64(p[8:]), Reloaded: le.Uint64(p[16:]), L1Copied: le.Uint64(p[24:])}
		p = p[32:]
	}
	for w := 0; w < s.OKBits; w += 64 {
		word := le.Uint64(p)
		p = p[8:]
		n := min(64, s.OKBits-w)
		if n < 64 && word>>n != 0 {
			return fail("ok word %d has bits set past bit %d: %w", w/64, s.OKBits, ErrMalformed)
		}
		for i := 0; i < n; i++ {
			c.OK[w+i] = word&(1<<i) != 0
		}
	}
	for i := range c.Prefix {
		c.Prefix[i] = le.Uint32(p)
		p = p[4:]
	}
	if s.Digest {
		c.Digest = Digest(p[:32])
		p = p[32:]
		for i := range c.Structures {
			c.Structures[i] = Digest(p[:32])
			p = p[32:]
		}
	}
	return env, c, nil
}
