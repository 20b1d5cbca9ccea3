package l1cuda

import (
	"github.com/kvtier/kvtier/quantity"

	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"github.com/kvtier/kvtier/tiers"
)

// CUDAConfig configures the cuda pool.
type CUDAConfig struct {
	// Library is the CUDA runtime to load (a path or a soname); empty
	// tries DefaultCUDALibraries in order.
	Library string `yaml:"library"`
	// Device is the CUDA device ordinal.
	Device int `yaml:"device"`
	// Pages and Layers give the layer-first geometry of the KV pool.
	Pages  int `yaml:"pages"`
	Layers int `yaml:"layers"`
	// IPCHandles, one per payload kind in kind order, are the engine's KV
	// pool allocations as hex-encoded cudaIpcMemHandle_t (128 hex digits).
	// Empty: the pool allocates its own device memory (tests, a
	// standalone L1).
	IPCHandles []string `yaml:"ipc_handles"`
	// RegisterCeiling is the most bytes one cudaHostRegister call may pin
	// (the driver refuses very large ones: 512 GiB has worked, 1 TiB has
	// failed). A larger slab is registered in pieces, and a copy that
	// would straddle two pieces is refused.
	RegisterCeiling quantity.Size `yaml:"register_ceiling"`
}

// DefaultRegisterCeiling is 480 GiB, under the largest single registration
// known to work.
const DefaultRegisterCeiling = 480 * quantity.GiB

// DefaultCUDAConfig returns the defaults.
func DefaultCUDAConfig() CUDAConfig {
	return CUDAConfig{Pages: 256, Layers: 1, RegisterCeiling: DefaultRegisterCeiling}
}

// Validate checks the config without the payload geometry or a GPU.
func (c *CUDAConfig) Validate() error {
	switch {
	case c.Pages < 1 || c.Pages > 1<<24:
		return fmt.Errorf("l1 cuda pool: pages %d outside [1, %d]", c.Pages, 1<<24)
	case c.Layers < 1 || c.Layers > 4096:
		return fmt.Errorf("l1 cuda pool: layers %d outside [1, 4096]", c.Layers)
	case c.Device < 0 || c.Device > 1024:
		return fmt.Errorf("l1 cuda pool: device %d outside [0, 1024]", c.Device)
	case c.RegisterCeiling < 1<<21:
		return fmt.Errorf("l1 cuda pool: register_ceiling %s is below one 2MiB page", c.RegisterCeiling)
	}
	for i, h := range c.IPCHandles {
		if _, err := decodeIPCHandle(h); err != nil {
			return fmt.Errorf("l1 cuda pool: ipc_handles[%d]: %w", i, err)
		}
	}
	return nil
}

func decodeIPCHandle(s string) (ipcMemHandle, error) {
	var h ipcMemHandle
	if len(s) != 2*len(h.reserved) {
		return h, fmt.Errorf("handle of %d hex digits, want %d", len(s), 2*len(h.reserved))
	}
	if _, err := hex.Decode(h.reserved[:], []byte(s)); err != nil {
		return h, fmt.Errorf("handle is not hex: %w", err)
	}
	return h, nil
}

// registration is one pinned piece of a slab: [off, off+size) of slab id.
type registration struct {
	slab      tiers.SlabID
	off, size int64
	ptr       unsafe.Pointer
}

// CUDAPool is Pool v1 on a GPU through libcudart loaded at run time.
type CUDAPool struct {
	base
	rt     *cudart
	dev    []uintptr // per kind: device base address
	ipc    bool      // dev came from IPC handles (close them, do not free)
	regs   []registration
	stream uintptr

	submitMu sync.Mutex // orders enqueues on the stream
	waits    chan cudaBatch
	waiter   sync.WaitGroup
	once     sync.Once
}

type cudaBatch struct {
	id     tiers.BatchID
	batch  []tiers.PoolCopy
	errs   []error
	event  uintptr
	toSlab bool
}

// OpenCUDA loads the runtime, selects the device, opens or allocates the
// KV memory, pins the slab and creates the copy stream. Any step that
// fails fails the open with the step named: the pool never runs without
// its fast path.
func OpenCUDA(env tiers.Env, cfg CUDAConfig) (p *CUDAPool, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, tiers.ErrInvalid)
	}
	if env.Slab == nil {
		return nil, fmt.Errorf("l1 cuda pool: no slab to copy through: %w", tiers.ErrInvalid)
	}
	lay, err := newLayout(cfg.Pages, cfg.Layers, env.Payload)
	if err != nil {
		return nil, fmt.Errorf("l1 cuda pool: %w", err)
	}
	if n := len(cfg.IPCHandles); n != 0 && n != len(lay.kinds) {
		return nil, fmt.Errorf("l1 cuda pool: %d ipc_handles for %d payload kinds: %w", n, len(lay.kinds), tiers.ErrInvalid)
	}
	var names []string
	if cfg.Library != "" {
		names = []string{cfg.Library}
	}
	rt, err := loadCUDA(names)
	if err != nil {
		return nil, fmt.Errorf("l1 cuda pool: %w", err)
	}
	p = &CUDAPool{base: newBase("l1 cuda pool", fmt.Sprintf("cuda:%d", cfg.Device), env, lay), rt: rt, waits: make(chan cudaBatch, 256)}
	p.start = p.enqueue
	defer func() {
		if err != nil {
			err = errors.Join(err, p.release())
		}
	}()
	var count int32
	if err := rt.check("cudaGetDeviceCount", rt.getDeviceCount(&count)); err != nil {
		return nil, fmt.Errorf("l1 cuda pool (%s): %w", rt.name, err)
	}
	if int(count) <= cfg.Device {
		return nil, fmt.Errorf("l1 cuda pool: device %d, but %s sees %d devices", cfg.Device, rt.name, count)
	}
	if err := rt.check("cudaSetDevice", rt.setDevice(int32(cfg.Device))); err != nil {
		return nil, fmt.Errorf("l1 cuda pool: %w", err)
	}
	for k := range lay.kinds {
		var ptr uintptr
		if len(cfg.IPCHandles) > 0 {
			h, _ := decodeIPCHandle(cfg.IPCHandles[k])
			if err := rt.check("cudaIpcOpenMemHandle", rt.ipcOpenMemHandle(&ptr, h, cudaIpcLazyEnable)); err != nil {
				return nil, fmt.Errorf("l1 cuda pool: open the engine's KV memory of payload %q: %w", lay.kinds[k].Name, err)
			}
			p.ipc = true
		} else if err := rt.check("cudaMalloc", rt.malloc(&ptr, uintptr(lay.kindBytes(tiers.PayloadKind(k))))); err != nil {
			return nil, fmt.Errorf("l1 cuda pool: allocate %d bytes for payload %q: %w", lay.kindBytes(tiers.PayloadKind(k)), lay.kinds[k].Name, err)
		}
		p.dev = append(p.dev, ptr)
	}
	if err := p.register(cfg.RegisterCeiling); err != nil {
		return nil, err
	}
	if err := rt.check("cudaStreamCreateWithFlags", rt.streamCreate(&p.stream, cudaStreamNonBlock)); err != nil {
		return nil, fmt.Errorf("l1 cuda pool: %w", err)
	}
	p.waiter.Add(1)
	go p.wait()
	return p, nil
}

// register pins every slab file in pieces of at most ceiling bytes
// (rounded down to the slab's page size), one cudaHostRegister each.
func (p *CUDAPool) register(ceiling quantity.Size) error {
	g := p.slab.Geometry()
	piece := int64(ceiling)
	if g.PageSize > 0 {
		piece -= piece % g.PageSize
	}
	for _, f := range g.Slabs {
		for off := int64(0); off < f.Size; off += piece {
			size := min(piece, f.Size-off)
			b, err := p.slab.Bytes(tiers.Span{Slab: f.ID, Offset: off, Length: size})
			if err != nil {
				return fmt.Errorf("l1 cuda pool: slab %d [%d,+%d): %w", f.ID, off, size, err)
			}
			ptr := unsafe.Pointer(unsafe.SliceData(b))
			if err := p.rt.check("cudaHostRegister", p.rt.hostRegister(ptr, uintptr(size), cudaHostRegDefault)); err != nil {
				return fmt.Errorf("l1 cuda pool: pin slab %d [%d,+%d) (%s): %w", f.ID, off, size, f.Path, err)
			}
			p.regs = append(p.regs, registration{slab: f.ID, off: off, size: size, ptr: ptr})
		}
	}
	return nil
}

// inOneRegistration reports whether span lies inside one pinned piece.
func (p *CUDAPool) inOneRegistration(sp tiers.Span) bool {
	i := sort.Search(len(p.regs), func(i int) bool {
		r := p.regs[i]
		return r.slab > sp.Slab || (r.slab == sp.Slab && r.off+r.size > sp.Offset)
	})
	if i == len(p.regs) {
		return false
	}
	r := p.regs[i]
	return r.slab == sp.Slab && sp.Offset >= r.off && sp.Offset+sp.Length <= r.off+r.size
}

// enqueue puts an admitted batch's copies and its fence event on the
// stream.
func (p *CUDAPool) enqueue(batch []tiers.PoolCopy, toSlab bool) (tiers.BatchID, error) {
	for i, c := range batch {
		if !p.inOneRegistration(c.Span) {
			return 0, fmt.Errorf("l1 cuda pool: copy item %d: span %+v straddles two slab registrations: %w", i, c.Span, tiers.ErrInvalid)
		}
	}
	p.submitMu.Lock()
	defer p.submitMu.Unlock()
	id, err := p.begin("l1 cuda pool")
	if err != nil {
		return 0, err
	}
	b := cudaBatch{id: id, batch: append([]tiers.PoolCopy(nil), batch...), errs: make([]error, len(batch)), toSlab: toSlab}
	for i, c := range batch {
		span, _ := p.slab.Bytes(c.Span)
		// NB: the slab is mapped memory (or, in tests, a Go heap slice,
		// which never moves) kept alive by the slab until Close, so its
		// address may travel as a uintptr; a device address is not Go
		// memory at all.
		host := uintptr(unsafe.Pointer(unsafe.SliceData(span)))
		slice := uintptr(p.lay.slice(c.Kind))
		pitch := uintptr(p.lay.pages) * slice
		dev := p.dev[c.Kind] + uintptr(c.Page)*slice
		var code int32
		if toSlab {
			code = p.rt.memcpy2DAsync(host, slice, dev, pitch, slice, uintptr(p.lay.layers), cudaMemcpyDeviceToHost, p.stream)
		} else {
			code = p.rt.memcpy2DAsync(dev, pitch, host, slice, slice, uintptr(p.lay.layers), cudaMemcpyHostToDevice, p.stream)
		}
		b.errs[i] = p.rt.check("cudaMemcpy2DAsync", code)
	}
	if err := p.rt.check("cudaEventCreateWithFlags", p.rt.eventCreate(&b.event, cudaEventNoTiming)); err == nil {
		if err := p.rt.check("cudaEventRecord", p.rt.eventRecord(b.event, p.stream)); err != nil {
			p.rt.eventDestroy(b.event)
			b.event = 0
			failAll(b.errs, err)
		}
	} else {
		failAll(b.errs, err)
	}
	p.waits <- b
	return id, nil
}

func failAll(errs []error, err error) {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}

// wait fences each batch on its event, in submission order, and acks its
// items: the slab span of an item is not reused before its event fired.
func (p *CUDAPool) wait() {
	defer p.waiter.Done()
	for b := range p.waits {
		if b.event != 0 {
			if err := p.rt.check("cudaEventSynchronize", p.rt.eventSynchronize(b.event)); err != nil {
				failAll(b.errs, err)
			}
			p.rt.eventDestroy(b.event)
		}
		for i, c := range b.batch {
			var err error
			if b.errs[i] != nil {
				err = fmt.Errorf("l1 cuda pool: page %d kind %d: %w", c.Page, c.Kind, b.errs[i])
			}
			p.ack(b.id, i, c, b.toSlab, err)
		}
		p.end()
	}
}

// Close waits for in-flight copies, then unpins the slab and releases the
// device memory and the stream.
func (p *CUDAPool) Close() error {
	var err error
	p.once.Do(func() {
		p.shut()
		close(p.waits)
		p.waiter.Wait()
		err = p.release()
	})
	return err
}

// release frees what OpenCUDA acquired, in reverse order.
func (p *CUDAPool) release() error {
	var errs []error
	if p.stream != 0 {
		errs = append(errs, p.rt.check("cudaStreamDestroy", p.rt.streamDestroy(p.stream)))
		p.stream = 0
	}
	for i := len(p.regs) - 1; i >= 0; i-- {
		errs = append(errs, p.rt.check("cudaHostUnregister", p.rt.hostUnregister(p.regs[i].ptr)))
	}
	p.regs = nil
	for _, d := range p.dev {
		if p.ipc {
			errs = append(errs, p.rt.check("cudaIpcCloseMemHandle", p.rt.ipcCloseMemHandle(d)))
		} else {
			errs = append(errs, p.rt.check("cudaFree", p.rt.free(d)))
		}
	}
	p.dev = nil
	return errors.Join(errs...)
}
