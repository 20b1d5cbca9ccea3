package l1cuda

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvtier/kvtier/tiers"
)

// EngineConfig configures the engine pool.
type EngineConfig struct {
	// Pages is the number of pages of the engine's KV pool that kvtier may
	// name in a plan (the engine's block count).
	Pages int `yaml:"pages"`
	// Layers is the number of layer slices of a page in the engine's
	// layout (documentation for the engine's copy kernel; every payload's
	// page_bytes must be a multiple of it).
	Layers int `yaml:"layers"`
	// MaxPending bounds the copy items planned but not yet reported
	// finished by the engine; a batch that would exceed it is refused with
	// ErrBusy, so a stalled engine cannot grow the queue without limit.
	MaxPending int `yaml:"max_pending"`
}

// DefaultEngineConfig returns the defaults.
func DefaultEngineConfig() EngineConfig {
	return EngineConfig{Pages: 4096, Layers: 1, MaxPending: 1 << 16}
}

// Validate checks the config without the payload geometry.
func (c *EngineConfig) Validate() error {
	switch {
	case c.Pages < 1 || c.Pages > 1<<24:
		return fmt.Errorf("l1 engine pool: pages %d outside [1, %d]", c.Pages, 1<<24)
	case c.Layers < 1 || c.Layers > 4096:
		return fmt.Errorf("l1 engine pool: layers %d outside [1, 4096]", c.Layers)
	case c.MaxPending < 1 || c.MaxPending > 1<<24:
		return fmt.Errorf("l1 engine pool: max_pending %d outside [1, %d]", c.MaxPending, 1<<24)
	}
	return nil
}

// ErrBusy means the engine has too many planned copies outstanding; the
// batch was not accepted.
var ErrBusy = errors.New("engine copy queue full")

// PlannedCopy is one copy the engine must run: the item Index of batch
// Batch, in direction ToSlab (engine page to slab span) or not.
type PlannedCopy struct {
	Batch  tiers.BatchID
	Index  int
	ToSlab bool
	Copy   tiers.PoolCopy
}

// EnginePool is Pool v1 whose copies the engine runs: CopyToSlab and
// CopyFromSlab only plan; the engine takes the plans with TakePlans, does
// the copies with its own kernels and reports each finished item with
// Complete, and the acks follow. kvtier links no CUDA for it.
type EnginePool struct {
	base
	max int

	mu      sync.Mutex
	plans   []PlannedCopy
	pending map[tiers.BatchID]*engineBatch // batches with items planned, not completed
	items   int                            // items outstanding over every batch
	free    []*engineBatch                 // batches done, their arrays kept for reuse
	once    sync.Once
}

// engineBatch is a batch's items (by index) while any is outstanding.
// NB: one map entry a batch, not an entry an item: a step plans and
// completes every page of every rank's copies.
type engineBatch struct {
	items []PlannedCopy
	done  []bool
	left  int
}

// OpenEngine opens an engine pool over env's slab.
func OpenEngine(env tiers.Env, cfg EngineConfig) (*EnginePool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
	}
	if env.Slab == nil {
		return nil, fmt.Errorf("l1 engine pool: no slab to copy through: %w", tiers.ErrInvalid)
	}
	lay, err := newLayout(cfg.Pages, cfg.Layers, env.Payload)
	if err != nil {
		return nil, fmt.Errorf("l1 engine pool: %w", err)
	}
	p := &EnginePool{
		base:    newBase("l1 engine pool", "engine", env, lay),
		max:     cfg.MaxPending,
		pending: make(map[tiers.BatchID]*engineBatch),
	}
	p.start = p.plan
	return p, nil
}

// plan records an admitted batch for the engine to take.
func (p *EnginePool) plan(batch []tiers.PoolCopy, toSlab bool) (tiers.BatchID, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.items+len(batch) > p.max {
		return 0, fmt.Errorf("l1 engine pool: %d copies outstanding + %d > max_pending %d: %w", p.items, len(batch), p.max, ErrBusy)
	}
	id, err := p.begin("l1 engine pool")
	if err != nil {
		return 0, err
	}
	var b *engineBatch
	if n := len(p.free); n > 0 {
		b, p.free = p.free[n-1], p.free[:n-1]
	} else {
		b = &engineBatch{}
	}
	b.items, b.done, b.left = b.items[:0], b.done[:0], len(batch)
	for i, c := range batch {
		pc := PlannedCopy{Batch: id, Index: i, ToSlab: toSlab, Copy: c}
		p.plans = append(p.plans, pc)
		b.items = append(b.items, pc)
		b.done = append(b.done, false)
	}
	p.pending[id] = b
	p.items += len(batch)
	return id, nil
}

// TakePlans appends the copies planned since the last call to dst, in
// plan order, and returns it. The engine runs them and reports each with
// Complete.
func (p *EnginePool) TakePlans(dst []PlannedCopy) []PlannedCopy {
	p.mu.Lock()
	defer p.mu.Unlock()
	dst = append(dst, p.plans...)
	p.plans = p.plans[:0]
	return dst
}

// Complete reports that the engine finished item index of batch (err nil)
// or failed it. A report for an item never planned, or reported before,
// is refused with ErrInvalid and changes nothing.
func (p *EnginePool) Complete(batch tiers.BatchID, index int, err error) error {
	p.mu.Lock()
	b := p.pending[batch]
	if b == nil || index < 0 || index >= len(b.items) || b.done[index] {
		p.mu.Unlock()
		return fmt.Errorf("l1 engine pool: completion of batch %d item %d, which is not outstanding: %w", batch, index, tiers.ErrInvalid)
	}
	pc := b.items[index]
	b.done[index] = true
	b.left--
	p.items--
	last := b.left == 0
	if last {
		delete(p.pending, batch)
		p.free = append(p.free, b)
	}
	p.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("l1 engine pool: engine failed page %d kind %d: %w", pc.Copy.Page, pc.Copy.Kind, err)
	}
	p.ack(batch, index, pc.Copy, pc.ToSlab, err)
	if last {
		p.end()
	}
	return nil
}

// Outstanding reports whether batch has items planned and not yet
// reported.
func (p *EnginePool) Outstanding(batch tiers.BatchID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending[batch] != nil
}

// CompleteBatch reports every outstanding item of batch finished (err nil)
// or failed: the engine reports a plan whole. A batch with nothing
// outstanding is refused with ErrInvalid and changes nothing. Its acks
// are queued together, in index order, as Complete would queue them one
// by one.
func (p *EnginePool) CompleteBatch(batch tiers.BatchID, err error) error {
	p.mu.Lock()
	b := p.pending[batch]
	if b == nil {
		p.mu.Unlock()
		return fmt.Errorf("l1 engine pool: completion of batch %d, which has nothing outstanding: %w", batch, tiers.ErrInvalid)
	}
	left := make([]PlannedCopy, 0, b.left)
	for i, done := range b.done {
		if !done {
			left = append(left, b.items[i])
		}
	}
	p.items -= b.left
	b.left = 0
	delete(p.pending, batch)
	p.free = append(p.free, b)
	p.mu.Unlock()
	acks := make([]tiers.Ack, len(left))
	var pages, bytes int64
	for i, pc := range left {
		var ierr error
		if err != nil {
			ierr = fmt.Errorf("l1 engine pool: engine failed page %d kind %d: %w", pc.Copy.Page, pc.Copy.Kind, err)
		} else {
			pages, bytes = pages+1, bytes+pc.Copy.Span.Length
		}
		acks[i] = newAck(batch, pc.Index, ierr)
	}
	// NB: a batch has one direction (plan's toSlab).
	p.queue(left[0].ToSlab, pages, bytes, acks...)
	p.end()
	return nil
}

// FailPending fails every item the engine has not reported (the engine
// that owed them is gone) and drops the plans not yet taken; the pool
// stays open for the next engine. It returns the number of batches
// failed.
func (p *EnginePool) FailPending(why error) int {
	p.mu.Lock()
	left := p.outstanding()
	p.plans = p.plans[:0]
	p.mu.Unlock()
	slices.SortFunc(left, func(a, b PlannedCopy) int {
		return cmp.Or(cmp.Compare(a.Batch, b.Batch), cmp.Compare(a.Index, b.Index))
	})
	batches := 0
	for i, pc := range left {
		if i == 0 || left[i-1].Batch != pc.Batch {
			batches++
		}
		// An item completed concurrently is no longer outstanding: skip.
		_ = p.Complete(pc.Batch, pc.Index, why)
	}
	return batches
}

// Close fails every copy the engine has not reported (AckFailed with
// ErrClosed: the engine is gone or no longer reports) and refuses new
// plans.
func (p *EnginePool) Close() error {
	p.once.Do(func() {
		p.mu.Lock()
		p.refuse()
		left := p.outstanding()
		p.plans = nil
		p.mu.Unlock()
		slices.SortFunc(left, func(a, b PlannedCopy) int {
			return cmp.Or(cmp.Compare(a.Batch, b.Batch), cmp.Compare(a.Index, b.Index))
		})
		for _, pc := range left {
			if err := p.Complete(pc.Batch, pc.Index, tiers.ErrClosed); err != nil {
				panic(fmt.Sprintf("l1 engine pool: closing an outstanding item failed: %v", err))
			}
		}
		p.shut()
	})
	return nil
}

// outstanding returns the items not yet completed (in no order: the
// callers sort them). Called with p.mu held.
func (p *EnginePool) outstanding() []PlannedCopy {
	left := make([]PlannedCopy, 0, p.items)
	for _, b := range p.pending {
		for i, pc := range b.items {
			if !b.done[i] {
				left = append(left, pc)
			}
		}
	}
	return left
}
