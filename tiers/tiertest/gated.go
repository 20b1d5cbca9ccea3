package tiertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvtier/kvtier/pagehash"
	"github.com/kvtier/kvtier/tiers"
)

// GatedStore is a fake for fault injection: it wraps a real Store and,
// while closed, makes every call (Put, Get, LongestPrefix, Delete, Touch)
// wait until the test opens the gate (or the call's context ends), to
// stand for a tier that stalls: a disk stuck in I/O, a Redis behind a
// partition, a plugin that hangs. Opened, every call goes straight to the
// wrapped store. DrainAcks, AckReady, Stats and Close never wait.
type GatedStore struct {
	tiers.Store

	mu   sync.Mutex
	open chan struct{} // closed while the gate is open

	waiting atomic.Int64
	calls   atomic.Int64
}

// NewGatedStore wraps s with the gate open.
func NewGatedStore(s tiers.Store) *GatedStore {
	g := &GatedStore{Store: s, open: make(chan struct{})}
	close(g.open)
	return g
}

// Block closes the gate: calls from now on wait.
func (g *GatedStore) Block() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// Release opens the gate: waiting calls go on, and later ones pass.
func (g *GatedStore) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// Waiting reports how many calls wait at the gate now.
func (g *GatedStore) Waiting() int64 { return g.waiting.Load() }

// Calls reports how many calls reached the gate since NewGatedStore.
func (g *GatedStore) Calls() int64 { return g.calls.Load() }

func (g *GatedStore) wait(ctx context.Context, op string) error {
	g.calls.Add(1)
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gated store %s: %w", op, ctx.Err())
	}
}

// Put implements tiers.Store.
func (g *GatedStore) Put(ctx context.Context, batch []tiers.PutRequest) (tiers.BatchID, error) {
	if err := g.wait(ctx, "put"); err != nil {
		return 0, err
	}
	return g.Store.Put(ctx, batch)
}

// Get implements tiers.Store.
func (g *GatedStore) Get(ctx context.Context, batch []tiers.GetRequest, results []error) error {
	if err := g.wait(ctx, "get"); err != nil {
		return err
	}
	return g.Store.Get(ctx, batch, results)
}

// LongestPrefix implements tiers.Store.
func (g *GatedStore) LongestPrefix(ctx context.Context, kind tiers.PayloadKind, chain []pagehash.Hash) (int, error) {
	if err := g.wait(ctx, "longest prefix"); err != nil {
		return 0, err
	}
	return g.Store.LongestPrefix(ctx, kind, chain)
}

// Delete implements tiers.Store.
func (g *GatedStore) Delete(ctx context.Context, keys []tiers.Key) error {
	if err := g.wait(ctx, "delete"); err != nil {
		return err
	}
	return g.Store.Delete(ctx, keys)
}

// Touch implements tiers.Store.
func (g *GatedStore) Touch(ctx context.Context, keys []tiers.Key) error {
	if err := g.wait(ctx, "touch"); err != nil {
		return err
	}
	return g.Store.Touch(ctx, keys)
}
