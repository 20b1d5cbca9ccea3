// Package storeclient is the Go client of kvtier.store.v1, the page-store
// door of `kvtier serve`: it registers a namespace, maps the door's L2 slab
// files shared, and turns BatchGet/BatchSet replies into []byte views of
// the mapped slab that the caller copies from or into (the one copy each
// way). A reply whose boot_id differs from the session's means serve
// restarted: the client registers again and the call's pages are misses.
package storeclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/kvtier/kvtier/api/storev1"
	"github.com/kvtier/kvtier/internal/crc32c"
)

// ErrRestarted reports that serve restarted during the call; the client has
// registered again and the call's pages count as misses.
var ErrRestarted = errors.New("kvtier storeclient: serve restarted (boot_id changed)")

// Options configure Dial.
type Options struct {
	// Socket is serve's unix socket path, or host:port for loopback TCP.
	Socket    string
	ClientID  string
	Namespace *pb.Namespace
	// CheckAtRelease asks the door to check the L2 hits' CRC32C while the
	// caller copies them (GetRequest.check_at_release): Get returns
	// sooner, and Release says which hits failed (their Status turns
	// GET_STATUS_CORRUPT) or, with an error, that none is confirmed.
	CheckAtRelease bool
	// ClientSums carries every page's CRC32C through the client
	// (docs/store-api.md, "Checksums carried by the client"): Got.CopyOut
	// copies a hit and checks it against the door's sum in one pass,
	// Release reports the copies that failed, Reserved.CopyIn copies a
	// page in and takes its sums in one pass, and Commit hands them over.
	// The door then reads no page's bytes. It takes precedence over
	// CheckAtRelease.
	ClientSums bool
}

// Client is one session of the store door.
type Client struct {
	opts Options
	conn *grpc.ClientConn
	rpc  pb.StoreClient

	mu    sync.Mutex
	reg   *pb.RegisterReply
	slabs [][]byte
}

// Dial connects and registers.
func Dial(ctx context.Context, o Options) (*Client, error) {
	if o.Socket == "" {
		return nil, errors.New("kvtier storeclient: no socket")
	}
	if o.Namespace == nil {
		return nil, errors.New("kvtier storeclient: no namespace")
	}
	target := o.Socket
	if strings.HasPrefix(target, "/") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("kvtier storeclient: dial %s: %w", o.Socket, err)
	}
	c := &Client{opts: o, conn: conn, rpc: pb.NewStoreClient(conn)}
	if err := c.register(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// register opens a session and maps its slab; c.mu is not held.
func (c *Client) register(ctx context.Context) error {
	r, err := c.rpc.Register(ctx, &pb.RegisterRequest{ClientId: c.opts.ClientID, Namespace: c.opts.Namespace, ProtocolVersions: []uint32{1}})
	if err != nil {
		return fmt.Errorf("kvtier storeclient: register: %w", err)
	}
	maps, err := mapSlab(r.GetSlab())
	if err != nil {
		return err
	}
	c.mu.Lock()
	old := c.slabs
	c.reg, c.slabs = r, maps
	c.mu.Unlock()
	unmap(old)
	return nil
}

func mapSlab(g *pb.SlabGeometry) ([][]byte, error) {
	var maps [][]byte
	for i, f := range g.GetFiles() {
		if int(f.GetId()) != i {
			unmap(maps)
			return nil, fmt.Errorf("kvtier storeclient: slab file %d has id %d", i, f.GetId())
		}
		if f.GetSize() == 0 || f.GetSize() > 1<<46 {
			unmap(maps)
			return nil, fmt.Errorf("kvtier storeclient: slab file %s: size %d", f.GetPath(), f.GetSize())
		}
		fd, err := unix.Open(f.GetPath(), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			unmap(maps)
			return nil, fmt.Errorf("kvtier storeclient: map slab %s: %w", f.GetPath(), err)
		}
		// MAP_POPULATE: the page tables are filled at Register, not by a
		// fault per 4 KiB page inside the first copies (a 352 MiB batch
		// is 90k faults on the shm fallback).
		b, err := unix.Mmap(fd, 0, int(f.GetSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		unix.Close(fd)
		if err != nil {
			unmap(maps)
			return nil, fmt.Errorf("kvtier storeclient: map slab %s: %w", f.GetPath(), err)
		}
		maps = append(maps, b)
	}
	return maps, nil
}

func unmap(maps [][]byte) {
	for _, b := range maps {
		_ = unix.Munmap(b)
	}
}

// span resolves sp to the mapped bytes; out of range is an error naming it.
func span(maps [][]byte, sp *pb.Span) ([]byte, error) {
	if int(sp.GetSlab()) >= len(maps) {
		return nil, fmt.Errorf("kvtier storeclient: span names slab %d of %d", sp.GetSlab(), len(maps))
	}
	m := maps[sp.GetSlab()]
	off, n := sp.GetOffset(), sp.GetLength()
	if off > uint64(len(m)) || n > uint64(len(m))-off {
		return nil, fmt.Errorf("kvtier storeclient: span [%d, +%d) outside slab %d of %d bytes", off, n, sp.GetSlab(), len(m))
	}
	return m[off : off+n], nil
}

func (c *Client) session() (string, string, [][]byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reg.GetSession(), c.reg.GetBootId(), c.slabs
}

// Registration is the last RegisterReply (limits, kinds, tiers).
func (c *Client) Registration() *pb.RegisterReply {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reg
}

// check re-registers when a reply's boot_id is not the session's.
func (c *Client) check(ctx context.Context, boot, got string) error {
	if got == boot {
		return nil
	}
	if err := c.register(ctx); err != nil {
		return fmt.Errorf("%w; register again: %w", ErrRestarted, err)
	}
	return ErrRestarted
}

// gone turns a call's error into ErrRestarted, registering again, when
// serve no longer knows the session (it restarted, or the session ended:
// NotFound naming the session, docs/store-api.md); other errors pass.
func (c *Client) gone(ctx context.Context, what string, err error) error {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.NotFound || !strings.HasPrefix(st.Message(), "session ") {
		return fmt.Errorf("kvtier storeclient: %s: %w", what, err)
	}
	if rerr := c.register(ctx); rerr != nil {
		return fmt.Errorf("%w: %s: %w; register again: %w", ErrRestarted, what, err, rerr)
	}
	return fmt.Errorf("%w: %s: %w", ErrRestarted, what, err)
}

// Exists returns the count of leading keys present and each one's tier.
func (c *Client) Exists(ctx context.Context, keys []string) (int, []pb.Tier, error) {
	return c.ExistsWith(ctx, keys, ExistsOptions{})
}

// ExistsOptions are BatchExists's hints (docs/store-api.md, "Prefetch").
type ExistsOptions struct {
	// Prefetch: the keys are a waiting request's; serve starts reloading
	// the pages it finds in L3 into the slab.
	Prefetch bool
	// Wait: answer once the reloads in flight of the pages serve would
	// answer TIER_L3 for have landed, or after Wait (whole milliseconds,
	// at least 1; serve bounds it by its max deadline).
	Wait time.Duration
}

// ExistsWith is Exists with o's hints.
func (c *Client) ExistsWith(ctx context.Context, keys []string, o ExistsOptions) (int, []pb.Tier, error) {
	var waitMS uint32
	if o.Wait > 0 {
		waitMS = uint32(min(max(o.Wait.Milliseconds(), 1), math.MaxUint32))
	}
	s, boot, _ := c.session()
	r, err := c.rpc.BatchExists(ctx, &pb.ExistsRequest{Session: s, BootId: boot, Keys: keys, Prefetch: o.Prefetch, WaitMs: waitMS})
	if err != nil {
		return 0, nil, c.gone(ctx, "exists", err)
	}
	if err := c.check(ctx, boot, r.GetBootId()); err != nil {
		return 0, nil, err
	}
	return int(r.GetPresent()), r.GetTiers(), nil
}

// Ping is the empty call (the limit bench store's exists row is measured
// against).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.rpc.Ping(ctx, &pb.PingRequest{})
	return err
}

// Got is one BatchGet's result: per key, its status and, for a hit, one
// view per payload kind into the mapped slab, valid until Release. With
// Options.CheckAtRelease a hit is confirmed only by a Release that
// returns no error and leaves its Status GET_STATUS_HIT.
type Got struct {
	Lease  uint64
	Status []pb.GetStatus
	Spans  [][][]byte
	// Sums has each hit's CRC32C per kind (Options.ClientSums).
	Sums [][]uint32
	boot string
	// failed: the hits whose CopyOut failed its check, for Release.
	failed []uint32
}

// CopyOut copies hit i's payload kinds into dst (one per kind, each at
// least the kind's bytes). With Options.ClientSums it checks each copy
// against the door's sum in the same pass: a copy that does not match is
// a miss (false, and Status[i] turns GET_STATUS_CORRUPT), reported to the
// door at Release. Without it, it copies and returns true.
func (g *Got) CopyOut(i int, dst ...[]byte) (bool, error) {
	if i < 0 || i >= len(g.Status) || g.Status[i] != pb.GetStatus_GET_STATUS_HIT {
		return false, fmt.Errorf("kvtier storeclient: copy out of position %d: not a hit", i)
	}
	if len(dst) != len(g.Spans[i]) {
		return false, fmt.Errorf("kvtier storeclient: copy out of position %d: %d destinations for %d payload kinds", i, len(dst), len(g.Spans[i]))
	}
	for k, src := range g.Spans[i] {
		if len(dst[k]) < len(src) {
			return false, fmt.Errorf("kvtier storeclient: copy out of position %d kind %d: %d bytes of room for %d", i, k, len(dst[k]), len(src))
		}
	}
	if g.Sums == nil {
		for k, src := range g.Spans[i] {
			copy(dst[k], src)
		}
		return true, nil
	}
	ok := true
	for k, src := range g.Spans[i] {
		ok = crc32c.CopyUpdate(0, dst[k], src) == g.Sums[i][k] && ok
	}
	if !ok {
		g.Status[i] = pb.GetStatus_GET_STATUS_CORRUPT
		g.failed = append(g.failed, uint32(i))
	}
	return ok, nil
}

// Get pins keys' pages and returns where they lie.
func (c *Client) Get(ctx context.Context, keys []string, deadlineMS uint32) (*Got, error) {
	s, boot, maps := c.session()
	r, err := c.rpc.BatchGet(ctx, &pb.GetRequest{Session: s, BootId: boot, Keys: keys, DeadlineMs: deadlineMS,
		CheckAtRelease: c.opts.CheckAtRelease && !c.opts.ClientSums, ClientVerifies: c.opts.ClientSums})
	if err != nil {
		return nil, c.gone(ctx, "get", err)
	}
	if err := c.check(ctx, boot, r.GetBootId()); err != nil {
		return nil, err
	}
	if len(r.GetPages()) != len(keys) {
		return nil, fmt.Errorf("kvtier storeclient: get: %d pages for %d keys", len(r.GetPages()), len(keys))
	}
	g := &Got{Lease: r.GetLease(), Status: make([]pb.GetStatus, len(keys)), Spans: make([][][]byte, len(keys)), boot: boot}
	if c.opts.ClientSums {
		g.Sums = make([][]uint32, len(keys))
	}
	for i, p := range r.GetPages() {
		g.Status[i] = p.GetStatus()
		if p.GetStatus() != pb.GetStatus_GET_STATUS_HIT {
			continue
		}
		if g.Sums != nil {
			if len(p.GetSums()) != len(p.GetSpans()) {
				// A serve older than client_verifies checked nothing for
				// us and sent no sums: the page is unconfirmed, a miss.
				g.Status[i] = pb.GetStatus_GET_STATUS_CORRUPT
				continue
			}
			g.Sums[i] = p.GetSums()
		}
		for _, sp := range p.GetSpans() {
			b, err := span(maps, sp)
			if err != nil {
				_ = c.Release(ctx, g)
				return nil, fmt.Errorf("kvtier storeclient: get %q: %w", keys[i], err)
			}
			g.Spans[i] = append(g.Spans[i], b)
		}
	}
	return g, nil
}

// Release drops a Get's pins; its views must not be used after. With
// Options.CheckAtRelease it also ends the door's check: the hits that
// failed it turn GET_STATUS_CORRUPT in g.Status, and an error means no
// hit's bytes are confirmed.
func (c *Client) Release(ctx context.Context, g *Got) error {
	if g == nil || g.Lease == 0 {
		return nil
	}
	s, boot, _ := c.session()
	if boot != g.boot {
		if c.opts.CheckAtRelease && !c.opts.ClientSums {
			return ErrRestarted // the check went with the old serve
		}
		return nil // the pins went with the old serve
	}
	r, err := c.rpc.Release(ctx, &pb.ReleaseRequest{Session: s, BootId: boot, Lease: g.Lease, Corrupt: g.failed})
	if err != nil && c.opts.ClientSums {
		// The copies were checked here: a failed Release costs the door
		// its pins (they end with the lease), not the hits.
		return nil
	}
	if err != nil {
		return fmt.Errorf("kvtier storeclient: release: %w", err)
	}
	if err := c.check(ctx, boot, r.GetBootId()); err != nil {
		return err
	}
	for _, i := range r.GetCorrupt() {
		if int(i) >= len(g.Status) || g.Status[i] != pb.GetStatus_GET_STATUS_HIT {
			return fmt.Errorf("kvtier storeclient: release: corrupt position %d is not a hit of the get's %d keys", i, len(g.Status))
		}
		g.Status[i] = pb.GetStatus_GET_STATUS_CORRUPT
	}
	return nil
}

// Reserved is one BatchSet's result: per key, its status and, when
// RESERVED, one view per payload kind to fill before Commit.
type Reserved struct {
	Lease  uint64
	Status []pb.SetStatus
	Spans  [][][]byte
	boot   string
	// sums: with Options.ClientSums, per key and kind (key-major) the
	// CRC32C CopyIn took; summed[i]: key i's were taken.
	sums   []uint32
	summed []bool
}

// CopyIn copies src (one per payload kind, each the kind's bytes) into
// reserved position i's spans; with Options.ClientSums it takes each
// kind's CRC32C in the same pass, for Commit.
func (rs *Reserved) CopyIn(i int, src ...[]byte) error {
	if i < 0 || i >= len(rs.Status) || rs.Status[i] != pb.SetStatus_SET_STATUS_RESERVED {
		return fmt.Errorf("kvtier storeclient: copy into position %d: not reserved", i)
	}
	if len(src) != len(rs.Spans[i]) {
		return fmt.Errorf("kvtier storeclient: copy into position %d: %d sources for %d payload kinds", i, len(src), len(rs.Spans[i]))
	}
	for k, dst := range rs.Spans[i] {
		if len(src[k]) != len(dst) {
			return fmt.Errorf("kvtier storeclient: copy into position %d kind %d: %d bytes for a span of %d", i, k, len(src[k]), len(dst))
		}
	}
	nk := len(rs.Spans[i])
	for k, dst := range rs.Spans[i] {
		if rs.sums == nil {
			copy(dst, src[k])
			continue
		}
		rs.sums[i*nk+k] = crc32c.CopyUpdate(0, dst, src[k])
	}
	if rs.summed != nil {
		rs.summed[i] = true
	}
	return nil
}

// Set reserves slab spans for keys.
func (c *Client) Set(ctx context.Context, keys []string) (*Reserved, error) {
	s, boot, maps := c.session()
	r, err := c.rpc.BatchSet(ctx, &pb.SetRequest{Session: s, BootId: boot, Keys: keys})
	if err != nil {
		return nil, c.gone(ctx, "set", err)
	}
	if err := c.check(ctx, boot, r.GetBootId()); err != nil {
		return nil, err
	}
	if len(r.GetPages()) != len(keys) {
		return nil, fmt.Errorf("kvtier storeclient: set: %d pages for %d keys", len(r.GetPages()), len(keys))
	}
	rs := &Reserved{Lease: r.GetLease(), Status: make([]pb.SetStatus, len(keys)), Spans: make([][][]byte, len(keys)), boot: boot}
	if c.opts.ClientSums {
		rs.sums = make([]uint32, len(keys)*len(c.Registration().GetKinds()))
		rs.summed = make([]bool, len(keys))
	}
	for i, p := range r.GetPages() {
		rs.Status[i] = p.GetStatus()
		if p.GetStatus() != pb.SetStatus_SET_STATUS_RESERVED {
			continue
		}
		for _, sp := range p.GetSpans() {
			b, err := span(maps, sp)
			if err != nil {
				_, _ = c.Commit(ctx, rs, make([]bool, len(keys)))
				return nil, fmt.Errorf("kvtier storeclient: set %q: %w", keys[i], err)
			}
			rs.Spans[i] = append(rs.Spans[i], b)
		}
	}
	return rs, nil
}

// Commit stores the reserved pages written whole (written[i]) and
// abandons the rest; stored[i] says whether key i is stored.
func (c *Client) Commit(ctx context.Context, rs *Reserved, written []bool) ([]bool, error) {
	if len(written) != len(rs.Status) {
		return nil, fmt.Errorf("kvtier storeclient: commit: %d written flags for %d keys", len(written), len(rs.Status))
	}
	if rs.Lease == 0 {
		// Nothing was reserved (every key EXISTS, NO_SPACE or INVALID):
		// no call; the keys that exist are stored.
		stored := make([]bool, len(written))
		for i, st := range rs.Status {
			stored[i] = st == pb.SetStatus_SET_STATUS_EXISTS
		}
		return stored, nil
	}
	s, boot, _ := c.session()
	if boot != rs.boot {
		return make([]bool, len(written)), ErrRestarted
	}
	var sums []uint32
	if rs.sums != nil {
		sums = rs.sums
		for i, w := range written {
			if w && !rs.summed[i] {
				// Written other than by CopyIn: the door takes the sums.
				sums = nil
				break
			}
		}
	}
	r, err := c.rpc.Commit(ctx, &pb.CommitRequest{Session: s, BootId: boot, Lease: rs.Lease, Written: written, Sums: sums})
	if err != nil {
		return nil, fmt.Errorf("kvtier storeclient: commit: %w", err)
	}
	if err := c.check(ctx, boot, r.GetBootId()); err != nil {
		return make([]bool, len(written)), err
	}
	return r.GetStored(), nil
}

// Clear drops the namespace's pages.
func (c *Client) Clear(ctx context.Context) error {
	s, boot, _ := c.session()
	r, err := c.rpc.Clear(ctx, &pb.ClearRequest{Session: s, BootId: boot})
	if err != nil {
		return c.gone(ctx, "clear", err)
	}
	return c.check(ctx, boot, r.GetBootId())
}

// Stats returns the door's counters.
func (c *Client) Stats(ctx context.Context) (*pb.StatsReply, error) {
	s, boot, _ := c.session()
	r, err := c.rpc.Stats(ctx, &pb.StatsRequest{Session: s, BootId: boot})
	if err != nil {
		return nil, c.gone(ctx, "stats", err)
	}
	if err := c.check(ctx, boot, r.GetBootId()); err != nil {
		return nil, err
	}
	return r, nil
}

// Close ends the session, unmaps the slab and closes the connection.
func (c *Client) Close(ctx context.Context) error {
	s, boot, _ := c.session()
	_, err := c.rpc.Close(ctx, &pb.CloseRequest{Session: s, BootId: boot})
	if err != nil {
		err = fmt.Errorf("kvtier storeclient: close: %w", err)
	}
	c.mu.Lock()
	unmap(c.slabs)
	c.slabs = nil
	c.mu.Unlock()
	return errors.Join(err, c.conn.Close())
}
