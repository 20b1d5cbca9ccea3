package l1cuda

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvtier/kvtier/internal/crc32c"
	"github.com/kvtier/kvtier/internal/memcopy"
	"github.com/kvtier/kvtier/tiers"
)

// HostConfig configures the host-memory pool.
type HostConfig struct {
	// Pages is the number of pool pages (each holds one payload of every
	// kind).
	Pages int `yaml:"pages"`
	// Layers is the number of layer slices a page is stored as (the
	// engine's layer-first layout); every payload's page_bytes must be a
	// multiple of it.
	Layers int `yaml:"layers"`
	// Workers is the number of goroutines that run copies (default 2).
	Workers int `yaml:"workers"`
}

// DefaultHostConfig returns the defaults: 256 pages of 1 layer, 2 workers.
func DefaultHostConfig() HostConfig { return HostConfig{Pages: 256, Layers: 1, Workers: 2} }

// maxHostPoolBytes bounds the memory a host pool may map (1 TiB): beyond
// it a config is a typo, not a pool.
const maxHostPoolBytes = 1 << 40

// Validate checks the config without the payload geometry.
func (c *HostConfig) Validate() error {
	switch {
	case c.Pages < 1 || c.Pages > 1<<24:
		return fmt.Errorf("l1 host pool: pages %d outside [1, %d]", c.Pages, 1<<24)
	case c.Layers < 1 || c.Layers > 4096:
		return fmt.Errorf("l1 host pool: layers %d outside [1, 4096]", c.Layers)
	case c.Workers < 1 || c.Workers > 256:
		return fmt.Errorf("l1 host pool: workers %d outside [1, 256]", c.Workers)
	}
	return nil
}

// HostPool is Pool v1 over anonymous host memory in the layer-first
// layout. It serves machines without a GPU and every test of the host.
type HostPool struct {
	base
	mem [][]byte // per kind, mmap'd: pages * page_bytes

	jobs    chan hostJob
	workers sync.WaitGroup
	once    sync.Once
}

type hostJob struct {
	id     tiers.BatchID
	batch  []tiers.PoolCopy
	toSlab bool
}

// OpenHost maps the pool's memory and starts its copy workers.
func OpenHost(env tiers.Env, cfg HostConfig) (*HostPool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
	}
	if env.Slab == nil {
		return nil, fmt.Errorf("l1 host pool: no slab to copy through: %w", tiers.ErrInvalid)
	}
	lay, err := newLayout(cfg.Pages, cfg.Layers, env.Payload)
	if err != nil {
		return nil, fmt.Errorf("l1 host pool: %w", err)
	}
	var total int64
	for k := range lay.kinds {
		total += lay.kindBytes(tiers.PayloadKind(k))
	}
	if total > maxHostPoolBytes {
		return nil, fmt.Errorf("l1 host pool: %d pages need %d bytes, more than the %d-byte limit: %w", cfg.Pages, total, int64(maxHostPoolBytes), tiers.ErrInvalid)
	}
	p := &HostPool{base: newBase("l1 host pool", "host", env, lay), jobs: make(chan hostJob, 64)}
	p.start = p.enqueue
	for k := range lay.kinds {
		m, err := unix.Mmap(-1, 0, int(lay.kindBytes(tiers.PayloadKind(k))), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			p.unmap()
			return nil, fmt.Errorf("l1 host pool: map %d bytes for payload %q: %w", lay.kindBytes(tiers.PayloadKind(k)), lay.kinds[k].Name, err)
		}
		p.mem = append(p.mem, m)
	}
	for range cfg.Workers {
		p.workers.Add(1)
		go p.work()
	}
	return p, nil
}

// enqueue hands an admitted batch to the copy workers.
func (p *HostPool) enqueue(batch []tiers.PoolCopy, toSlab bool) (tiers.BatchID, error) {
	id, err := p.begin("l1 host pool")
	if err != nil {
		return 0, err
	}
	// NB: the job channel is closed only after begin refuses new batches
	// and every begun batch ended, so this send never meets a closed
	// channel.
	p.jobs <- hostJob{id: id, batch: append([]tiers.PoolCopy(nil), batch...), toSlab: toSlab}
	return id, nil
}

func (p *HostPool) work() {
	defer p.workers.Done()
	for j := range p.jobs {
		for i, c := range j.batch {
			sum, err := p.copyOne(c, j.toSlab)
			p.ackSum(j.id, i, c, j.toSlab, err, sum, true)
		}
		p.end()
	}
}

// copyOne moves one payload page between its layer slices in the pool and
// its contiguous slab span. A copy into the slab returns the CRC-32C of
// the span it wrote, taken at once while the bytes are in cache: the sum
// the page carries to the tiers below (Ack.Sum).
func (p *HostPool) copyOne(c tiers.PoolCopy, toSlab bool) (uint32, error) {
	span, err := p.slab.Bytes(c.Span)
	if err != nil {
		return 0, fmt.Errorf("l1 host pool: page %d kind %d: %w", c.Page, c.Kind, err)
	}
	slice := int(p.lay.slice(c.Kind))
	stride := p.lay.pages * slice
	base := p.mem[c.Kind][c.Page*slice:]
	if !toSlab {
		memcopy.ScatterStrided(base, span, p.lay.layers, slice, stride)
		return 0, nil
	}
	// NB: one pass: each layer slice copied (streaming stores, as the
	// gather did) and checksummed together (crc32c.CopyUpdateStream). A
	// CRC of the span after the gather read it back from memory and cost
	// half as much again as the copy.
	var sum uint32
	for l := 0; l < p.lay.layers; l++ {
		sum = crc32c.CopyUpdateStream(sum, span[l*slice:(l+1)*slice], base[l*stride:l*stride+slice])
	}
	return sum, nil
}

// Close waits for in-flight copies (their acks stay drainable) and
// unmaps the pool.
func (p *HostPool) Close() error {
	var err error
	p.once.Do(func() {
		p.shut()
		close(p.jobs)
		p.workers.Wait()
		err = p.unmap()
	})
	return err
}

func (p *HostPool) unmap() error {
	var errs []error
	for k, m := range p.mem {
		if err := unix.Munmap(m); err != nil {
			errs = append(errs, fmt.Errorf("l1 host pool: unmap payload %d: %w", k, err))
		}
	}
	p.mem = nil
	return errors.Join(errs...)
}
