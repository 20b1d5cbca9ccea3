package pagestore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/nsdigest"
	"github.com/kvtier/kvtier/pagehash"
)

// namespaceID is the digest the door keys a namespace by (nsdigest's
// encoding) over every field that takes part (the proto's Namespace says
// which).
func namespaceID(ns *pb.Namespace) [32]byte {
	w := nsdigest.New("kvtier.store.namespace.v1")
	w.Str(ns.GetModel())
	w.Str(ns.GetModelRevision())
	w.Str(ns.GetKvLayout())
	w.Str(ns.GetDtype())
	w.Num(uint64(ns.GetPageTokens()))
	w.Num(uint64(len(ns.GetKinds())))
	for _, k := range ns.GetKinds() {
		w.Str(k.GetName())
		w.Num(k.GetPageBytes())
	}
	if ns.GetSharedAcrossTp() {
		w.Num(1)
	} else {
		w.Num(0)
		w.Num(uint64(ns.GetTpRank()))
		w.Num(uint64(ns.GetTpSize()))
	}
	w.Num(uint64(ns.GetCpRank()))
	w.Num(uint64(ns.GetCpSize()))
	w.Num(uint64(ns.GetPpRank()))
	w.Num(uint64(ns.GetPpSize()))
	w.Str(ns.GetSalt())
	return w.Sum()
}

// checkNamespace validates ns against the door's kinds; the error names
// the field.
func (d *Door) checkNamespace(ns *pb.Namespace) error {
	if ns == nil {
		return fmt.Errorf("namespace: missing")
	}
	if ns.GetModel() == "" {
		return fmt.Errorf("namespace.model: empty")
	}
	if err := nsdigest.CheckStrings(nsdigest.Field{Name: "model", Value: ns.GetModel()}, nsdigest.Field{Name: "model_revision", Value: ns.GetModelRevision()},
		nsdigest.Field{Name: "kv_layout", Value: ns.GetKvLayout()}, nsdigest.Field{Name: "dtype", Value: ns.GetDtype()}, nsdigest.Field{Name: "salt", Value: ns.GetSalt()}); err != nil {
		return err
	}
	if ns.GetPageTokens() == 0 {
		return fmt.Errorf("namespace.page_tokens: 0, want the tokens of one page")
	}
	for _, c := range []struct {
		name       string
		rank, size uint32
	}{{"tp", ns.GetTpRank(), ns.GetTpSize()}, {"cp", ns.GetCpRank(), ns.GetCpSize()}, {"pp", ns.GetPpRank(), ns.GetPpSize()}, {"dp", ns.GetDpRank(), ns.GetDpSize()}} {
		if c.size > 0 && c.rank >= c.size {
			return fmt.Errorf("namespace.%s_rank: %d, not below %s_size %d", c.name, c.rank, c.name, c.size)
		}
		if c.size == 0 && c.rank != 0 {
			return fmt.Errorf("namespace.%s_rank: %d with %s_size 0", c.name, c.rank, c.name)
		}
	}
	ks := ns.GetKinds()
	if len(ks) != len(d.kinds) {
		return fmt.Errorf("namespace.kinds: %d payload kinds, serve's store stack has %d (%s)", len(ks), len(d.kinds), d.kindList())
	}
	for i, k := range ks {
		if k.GetName() != d.kinds[i].Name {
			return fmt.Errorf("namespace.kinds[%d].name: %q, serve's store stack has %q there (%s)", i, k.GetName(), d.kinds[i].Name, d.kindList())
		}
		if int64(k.GetPageBytes()) != d.kinds[i].PageBytes {
			return fmt.Errorf("namespace.kinds[%d].page_bytes: %d, serve's kind %q has %d", i, k.GetPageBytes(), d.kinds[i].Name, d.kinds[i].PageBytes)
		}
	}
	return nil
}

func (d *Door) kindList() string {
	s := ""
	for i, k := range d.kinds {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %d bytes", k.Name, k.PageBytes)
	}
	return s
}

// pageKey is a page's key: SHA-256(namespace id || generation (8 bytes
// little-endian) || key string). buf is scratch space (returned, grown).
func pageKey(ns [32]byte, gen uint64, key string, buf []byte) (pagehash.Hash, []byte) {
	buf = append(buf[:0], ns[:]...)
	buf = binary.LittleEndian.AppendUint64(buf, gen)
	buf = append(buf, key...)
	return sha256.Sum256(buf), buf
}

// keyStatus checks one key: "" when valid, else why not.
func (d *Door) keyStatus(k string) string {
	if k == "" {
		return "empty"
	}
	if len(k) > d.opt.Limits.MaxKeyBytes {
		return "too long"
	}
	return ""
}

// hashKeys returns the keys' page keys under the session's namespace and
// generation; ok[i] is false for an invalid key.
func (d *Door) hashKeys(ses *session, keys []string, dst []pagehash.Hash, ok []bool) {
	ns := ses.ns
	known := make([]bool, len(keys))
	miss := 0
	d.mu.Lock()
	id, gen := ns.id, ns.gen
	if ns.cacheGen != gen {
		ns.cache, ns.cacheGen = nil, gen
	}
	for i, k := range keys {
		if d.keyStatus(k) != "" {
			ok[i] = false
			continue
		}
		ok[i] = true
		if h, hit := ns.cache[k]; hit {
			dst[i], known[i] = h, true
		} else {
			miss++
		}
	}
	d.mu.Unlock()
	if miss == 0 {
		return
	}
	var buf []byte
	for i, k := range keys {
		if ok[i] && !known[i] {
			dst[i], buf = pageKey(id, gen, k, buf)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ns.cacheGen != gen {
		return // cleared meanwhile
	}
	if ns.cache == nil || len(ns.cache)+miss > keyCacheSize {
		ns.cache = make(map[string]pagehash.Hash, min(keyCacheSize, 4*len(keys)))
	}
	for i, k := range keys {
		if ok[i] && !known[i] {
			ns.cache[k] = dst[i]
		}
	}
}

// keyCacheSize bounds a namespace's cache of page keys (key string to
// SHA-256 page key, for the current generation): the same keys come back
// in an exists, a get and a set, and a lookup costs a fifth of a hash.
// When full it starts over.
const keyCacheSize = 1 << 14

// Register opens a session for one client in a namespace.
func (d *Door) Register(ctx context.Context, q *pb.RegisterRequest) (*pb.RegisterReply, error) {
	if len(q.GetClientId()) > nsdigest.MaxString {
		return nil, status.Errorf(codes.InvalidArgument, "client_id: %d bytes, at most %d", len(q.GetClientId()), nsdigest.MaxString)
	}
	v1 := false
	for _, v := range q.GetProtocolVersions() {
		v1 = v1 || v == 1
	}
	if !v1 {
		return nil, status.Errorf(codes.FailedPrecondition, "protocol_versions: %v, this serve speaks 1", q.GetProtocolVersions())
	}
	if err := d.checkNamespace(q.GetNamespace()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	id := namespaceID(q.GetNamespace())
	var conn uint64
	if d.opt.ConnOf != nil {
		conn = d.opt.ConnOf(ctx)
	}
	ses := &session{id: newSessionID(), client: q.GetClientId(), conn: conn, last: time.Now(), leases: map[uint64]*lease{}}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, status.Errorf(codes.Unavailable, "serve is stopping")
	}
	ns := d.spaces[id]
	if ns == nil {
		ns = &nsState{id: id}
		d.spaces[id] = ns
	}
	ses.ns = ns
	d.sessions[ses.id] = ses
	d.mu.Unlock()
	d.log.Info("kvtier store: session registered", "session", ses.id, "client", ses.client, "model", q.GetNamespace().GetModel(), "namespace", hex.EncodeToString(id[:8]))
	g := d.opt.Slab.Geometry()
	sg := &pb.SlabGeometry{PageSize: uint64(g.PageSize), Backing: g.Backing}
	for _, f := range g.Slabs {
		sg.Files = append(sg.Files, &pb.SlabFile{Id: uint32(f.ID), Path: f.Path, Size: uint64(f.Size)})
	}
	l := d.opt.Limits
	out := &pb.RegisterReply{Session: ses.id, BootId: d.opt.BootID, ProtocolVersion: 1, Slab: sg,
		Limits: &pb.Limits{MaxBatchPages: uint32(l.MaxBatchPages), MaxKeyBytes: uint32(l.MaxKeyBytes), LeaseMs: uint32(l.Lease / time.Millisecond),
			SessionTtlMs: uint32(l.SessionTTL / time.Millisecond), DefaultDeadlineMs: uint32(l.DefaultDeadline / time.Millisecond),
			MaxDeadlineMs: uint32(l.MaxDeadline / time.Millisecond), SlabPages: uint64(d.nslots)},
		NamespaceId: append([]byte(nil), id[:]...), Tiers: []string{"l2"}}
	if d.opt.Store != nil {
		out.Tiers = append(out.Tiers, d.opt.StoreName)
	}
	for _, k := range d.kinds {
		out.Kinds = append(out.Kinds, &pb.PayloadKind{Name: k.Name, PageBytes: uint64(k.PageBytes)})
	}
	return out, nil
}

// session returns the open session id names, marking it used.
func (d *Door) session(id string) (*session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[id]
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "session %q: %v", id, errUnknownSession)
	}
	s.last = time.Now()
	return s, nil
}

// generationsFile keeps each cleared namespace's generation.
const generationsFile = "store-generations.json"

func (d *Door) loadGenerations() error {
	if d.opt.StateDir == "" {
		return nil
	}
	path := filepath.Join(d.opt.StateDir, generationsFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("page store: generations: %w", err)
	}
	var m map[string]uint64
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("page store: generations file %s: %w", path, err)
	}
	for k, g := range m {
		raw, err := hex.DecodeString(k)
		if err != nil || len(raw) != 32 {
			return fmt.Errorf("page store: generations file %s: namespace id %q is not 64 hex characters", path, k)
		}
		var id [32]byte
		copy(id[:], raw)
		d.spaces[id] = &nsState{id: id, gen: g}
	}
	return nil
}

// saveGenerations writes every namespace's generation that is not 0,
// through a temporary file and a rename, so a crash leaves the old file
// or the new one.
func (d *Door) saveGenerations() error {
	if d.opt.StateDir == "" {
		return nil
	}
	d.genMu.Lock()
	defer d.genMu.Unlock()
	m := map[string]uint64{}
	d.mu.Lock()
	for id, ns := range d.spaces {
		if ns.gen > 0 {
			m[hex.EncodeToString(id[:])] = ns.gen
		}
	}
	d.mu.Unlock()
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	path := filepath.Join(d.opt.StateDir, generationsFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("page store: generations: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("page store: generations: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("page store: generations: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("page store: generations: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("page store: generations: %w", err)
	}
	return nil
}
