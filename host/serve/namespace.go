package serve

import (
	"encoding/binary"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/kvtier/kvtier/api/enginev1"
	"github.com/kvtier/kvtier/internal/nsdigest"
	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// namespaceID is the digest serve keys a namespace by (nsdigest's
// encoding) over every field.
func namespaceID(ns *pb.Namespace) [32]byte {
	w := nsdigest.New("kvtier.namespace.v1")
	w.Str(ns.GetModel())
	w.Str(ns.GetKvLayout())
	w.Str(ns.GetDtype())
	w.Num(uint64(ns.GetPageTokens()))
	w.Num(uint64(len(ns.GetPageBytes())))
	for _, pbytes := range ns.GetPageBytes() {
		w.Num(pbytes)
	}
	w.Num(uint64(ns.GetShard()))
	w.Str(ns.GetSalt())
	return w.Sum()
}

// keyNamespace is the namespace serve keys pages by: every field but the
// shard. The ranks of a context-parallel engine send the same page hashes
// (the same tokens) for their own shards of the KV; their Machines must
// hold equal keys for their replicated state to be equal (the group
// compares digests), and each rank's pages live in that rank's own tiers,
// so the shard needs no place in the key.
func keyNamespace(ns *pb.Namespace) [32]byte {
	c := proto.Clone(ns).(*pb.Namespace)
	c.Shard = 0
	return namespaceID(c)
}

// checkNamespace validates ns against the stack's payload geometry; the
// error names the field.
func checkNamespace(ns *pb.Namespace, g tiers.PayloadGeometry) error {
	if ns == nil {
		return fmt.Errorf("namespace: missing")
	}
	if ns.GetModel() == "" {
		return fmt.Errorf("namespace.model: empty")
	}
	if err := nsdigest.CheckStrings(nsdigest.Field{Name: "model", Value: ns.GetModel()}, nsdigest.Field{Name: "kv_layout", Value: ns.GetKvLayout()},
		nsdigest.Field{Name: "dtype", Value: ns.GetDtype()}, nsdigest.Field{Name: "salt", Value: ns.GetSalt()}); err != nil {
		return err
	}
	if int(ns.GetPageTokens()) != g.PageTokens {
		return fmt.Errorf("namespace.page_tokens: %d, serve's stack has %d tokens per page", ns.GetPageTokens(), g.PageTokens)
	}
	if len(ns.GetPageBytes()) != len(g.Kinds) {
		return fmt.Errorf("namespace.page_bytes: %d payload kinds, serve's stack has %d (%s)", len(ns.GetPageBytes()), len(g.Kinds), kindList(g))
	}
	for i, b := range ns.GetPageBytes() {
		if int64(b) != g.Kinds[i].PageBytes {
			return fmt.Errorf("namespace.page_bytes[%d]: %d bytes, serve's kind %q has %d", i, b, g.Kinds[i].Name, g.Kinds[i].PageBytes)
		}
	}
	return nil
}

func kindList(g tiers.PayloadGeometry) string {
	s := ""
	for i, k := range g.Kinds {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d bytes", k.Name, k.PageBytes)
	}
	return s
}

// keyer turns a client's page hashes into serve's keys under one
// namespace: key = hash XOR namespace id. Within a namespace it is a
// bijection (distinct hashes stay distinct, prefixes stay prefixes); two
// namespaces share a key only if h1 XOR h2 equals id1 XOR id2, a 2^-256
// event for SHA-256 page hashes, the same odds as a hash collision. It
// costs one 32-byte XOR a page, where a second SHA-256 would cost a
// scheduler step's budget on long prompts.
type keyer [32]byte

// keys decodes pages hashes from b (pages x 32 bytes) into dst.
func (k *keyer) keys(dst []pagehash.Hash, pages uint32, b []byte) ([]pagehash.Hash, error) {
	if uint64(len(b)) != uint64(pages)*pagehash.Size {
		return dst, fmt.Errorf("%d bytes of hashes for %d pages (want %d)", len(b), pages, uint64(pages)*pagehash.Size)
	}
	dst = slices.Grow(dst, int(pages))
	// A word at a time: a step of 32 requests of 64 pages XORs 64 KiB.
	k0, k1 := binary.LittleEndian.Uint64(k[0:]), binary.LittleEndian.Uint64(k[8:])
	k2, k3 := binary.LittleEndian.Uint64(k[16:]), binary.LittleEndian.Uint64(k[24:])
	for i := range int(pages) {
		var h pagehash.Hash
		src := b[i*pagehash.Size : (i+1)*pagehash.Size : (i+1)*pagehash.Size]
		binary.LittleEndian.PutUint64(h[0:], binary.LittleEndian.Uint64(src[0:])^k0)
		binary.LittleEndian.PutUint64(h[8:], binary.LittleEndian.Uint64(src[8:])^k1)
		binary.LittleEndian.PutUint64(h[16:], binary.LittleEndian.Uint64(src[16:])^k2)
		binary.LittleEndian.PutUint64(h[24:], binary.LittleEndian.Uint64(src[24:])^k3)
		dst = append(dst, h)
	}
	return dst, nil
}
